"""The workload being measured, and the machine measuring it: workloads from
factories named ``package.module:function`` (`load_factory`,
`load_workload`), which may return a `Workload`, a tuple ``(model,
make_batch, loss_fn)`` or an object with those three attributes; the device
to measure on and a one-line description of the machine for provenance."""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from thrifty.core.errors import ProblemError, ThriftyError
from thrifty.core.optional import require
from thrifty.runtime.worlds.factory import resolve_factory

if TYPE_CHECKING:  # pragma: no cover
    from thrifty.runtime.measure.zoo import Workload

__all__ = ["load_factory", "load_workload", "as_workload", "resolve_device", "device_label",
           "machine_description", "import_torch"]


def import_torch() -> Any:
    return require("torch", "torch")


@dataclass(frozen=True)
class _Factory:
    """A resolved factory: calling it returns a checked `Workload`, and any error
    the user's function raises becomes a `ProblemError` naming the spec."""

    spec: str
    function: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> "Workload":
        try:
            made = self.function(*args, **kwargs)
        except ThriftyError:
            raise
        except Exception as e:
            raise ProblemError(f"factory '{self.spec}' raised {type(e).__name__}: {e}") from e
        return as_workload(made, source=f"factory '{self.spec}'")


def load_factory(spec: str) -> Callable[..., "Workload"]:
    """Resolve ``package.module:function`` to a callable that returns a
    checked `Workload` (`resolve_factory`); when the callable is called, a
    factory that raises or returns something else than a workload is a
    `ProblemError` naming the spec."""
    return _Factory(spec, resolve_factory(spec, returns="a workload"))


def load_workload(spec: str, *args: Any, **kwargs: Any) -> "Workload":
    """``load_factory(spec)(*args, **kwargs)``: import, call and check a factory."""
    return load_factory(spec)(*args, **kwargs)


def as_workload(made: Any, *, source: str = "the workload") -> "Workload":
    """Accept a `Workload`, a tuple ``(model, make_batch, loss_fn)`` or an object
    with attributes ``model``, ``make_batch`` and ``loss_fn``; anything else is a
    `ProblemError` that says what was given."""
    from thrifty.runtime.measure.zoo import Workload

    if isinstance(made, Workload):
        parts = (made.model, made.make_batch, made.loss_fn)
    elif isinstance(made, tuple) and len(made) == 3:
        parts = made
    elif all(hasattr(made, name) for name in ("model", "make_batch", "loss_fn")):
        parts = (made.model, made.make_batch, made.loss_fn)
    else:
        given = f"a tuple of {len(made)} items" if isinstance(made, tuple) else f"a value of type {type(made).__name__}"
        raise ProblemError(
            f"{source} returned {given}, but must return a Workload, a tuple "
            "(model, make_batch, loss_fn), or an object with attributes model, make_batch and loss_fn"
        )
    model, make_batch, loss_fn = parts
    torch = import_torch()
    if not isinstance(model, torch.nn.Module):
        raise ProblemError(f"{source}: model is a {type(model).__name__}, but must be a torch.nn.Module")
    for name, value in (("make_batch", make_batch), ("loss_fn", loss_fn)):
        if not callable(value):
            raise ProblemError(f"{source}: {name} is a {type(value).__name__}, but must be callable")
    return made if isinstance(made, Workload) else Workload(model, make_batch, loss_fn)


def resolve_device(device: str) -> Literal["cpu", "cuda"]:
    """``auto`` is ``cuda`` when torch sees a GPU, else ``cpu``."""
    torch = import_torch()
    if device not in ("auto", "cpu", "cuda"):
        raise ProblemError(f"device is '{device}', but must be 'auto', 'cpu' or 'cuda'")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ProblemError("device is 'cuda', but torch sees no CUDA device here")
    return device  # type: ignore[return-value]


def device_label(device: str) -> str:
    """The profile's ``device`` key: ``cpu``, or the GPU model as the catalog
    names it (``NVIDIA A100-SXM4-40GB`` -> ``A100``, ``Tesla T4`` -> ``T4``)."""
    if device == "cpu":
        return "cpu"
    torch = import_torch()
    name = torch.cuda.get_device_name()
    short = re.sub(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", "", name.strip())
    short = re.sub(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", "", short)
    return re.split(r"[\s-]", short)[0] or name


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine_description(device: str, threads: int) -> str:
    """One line: accelerator (if any), CPU model and logical CPUs, threads used,
    torch and Python versions, OS."""
    torch = import_torch()
    parts = []
    if device == "cuda":
        cuda = getattr(torch.version, "cuda", None)
        parts.append(f"{torch.cuda.get_device_name()} (CUDA {cuda})")
    parts.append(f"CPU {_cpu_model()} ({os.cpu_count()} logical CPUs)")
    parts.append(f"{threads} torch thread{'s' if threads != 1 else ''}")
    parts.append(f"torch {torch.__version__}")
    parts.append(f"Python {platform.python_version()}")
    parts.append(f"{platform.system()} {platform.release()} {platform.machine()}")
    return ", ".join(parts)


