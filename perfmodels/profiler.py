"""Measure a compute profile on the local device (Srifty 4.1).

`profile_workload` runs real training iterations of a `Workload` and records,
per local batch size, the forward and backward latency (mean and standard
deviation over repeats, after warm-up), the optimizer step, the largest batch
that fits, and when each parameter's gradient becomes ready in the backward
pass. The result is a `ComputeProfile` (``thrifty.compute_profile/1``).

Two kinds of repeats, because hooks cost time:

* latency repeats run without hooks: forward (model and loss), backward, and
  ``optimizer.step()`` + ``zero_grad()`` are timed separately, each batch's
  repeats split over a few passes over the sweep (so that noise from other
  work on the machine spreads over every batch size), each pass after warm-up;
* DDP's overhead (given the workload's factory spec, as the CLI does): in a
  spawned process, DDP on a world of one against the plain model, iterations
  interleaved in pairs at the trace's batch (``ddp_overhead_s``);
* readiness repeats, at one reference batch, run with a
  ``register_post_accumulate_grad_hook`` on every parameter. Each hook's
  timestamp, relative to the backward start and divided by that backward's
  duration, is that gradient's ``ready_frac`` (averaged over repeats); Srifty
  normalizes so that the trace scales to other batch sizes.

Co-located workers (CPU): with ``colocated=k`` the latency sweep is measured
a second time in ``k`` fresh processes at once (spawned, each loading the
workload from its factory spec, one barrier before every batch so that all
of them run the same batch together) and kept as the profile's
``colocated`` points: what one of ``k`` worker processes sharing the host's
cores sees. The pooled samples of all ``k`` give each point.

Devices: on CPU the run uses ``torch.set_num_threads(threads)`` and
``max_batch`` is the largest batch swept, or, given a memory limit, an
estimate from the saved activations (`estimate_max_batch`). On CUDA every
timestamp is a CUDA event after ``torch.cuda.synchronize()``, and ``max_batch``
comes from a doubling-then-bisection search for the largest batch whose
iteration does not run out of memory.

The workload's model is copied before it is trained, so the caller's weights
are left as they were.

Workloads come from factories named ``package.module:function``
(`load_factory`, `load_workload`), which may return a `Workload`, a tuple
``(model, make_batch, loss_fn)`` or an object with those three attributes.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import gc
import importlib
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from thrifty.datasets.errors import MissingDependencyError, ProblemError, ThriftyError, closest_names
from thrifty.datasets.optional import require
from thrifty.perfmodels.profile import ColocatedPoints, ComputeProfile, LayerGrad, ProfilePoint, Provenance

if TYPE_CHECKING:  # pragma: no cover
    from thrifty.perfmodels.zoo import Workload

__all__ = [
    "make_trainer",
    "timed_without_gc",
    "DEFAULT_REPEATS",
    "DEFAULT_WARMUP",
    "DEFAULT_ROUNDS",
    "DEFAULT_CPU_MAX_BATCH",
    "DEFAULT_CUDA_MAX_BATCH",
    "geometric_batches",
    "load_factory",
    "load_workload",
    "as_workload",
    "resolve_device",
    "device_label",
    "machine_description",
    "search_max_batch",
    "estimate_max_batch",
    "profile_workload",
    "measure_colocated",
    "measure_ddp_overhead",
    "report_from_child",
    "gather_children",
]

DEFAULT_REPEATS = 10
DEFAULT_WARMUP = 3
DEFAULT_ROUNDS = 3
DEFAULT_CPU_MAX_BATCH = 256
DEFAULT_CUDA_MAX_BATCH = 4096  # the OOM search stops here unless told otherwise
READY_BATCH_TARGET = 32  # the readiness trace is taken at the swept batch nearest this
DEFAULT_LR, DEFAULT_MOMENTUM = 1e-3, 0.9  # small: profiling must not make the weights blow up


def _import_torch() -> Any:
    return require("torch", "torch")


# --- factories ----------------------------------------------------------------------

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_SPEC = re.compile(rf"^({_DOTTED}):({_DOTTED})$")


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
    """Resolve ``package.module:function`` (the function may be a dotted
    attribute path, ``module:Class.method``) to a callable that returns a
    `Workload`. A bad spec, a module that cannot be imported, a missing or
    non-callable attribute is a `ProblemError`; so is, when the returned
    callable is called, a factory that raises or returns something else than a
    workload."""
    match = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if match is None:
        raise ProblemError(
            f"factory is {spec!r}, but must be 'package.module:function' "
            "(an importable module, a colon, then the name of a function in it)"
        )
    module_name, attribute_path = match.groups()
    module = _import_module(spec, module_name)
    function: Any = module
    for depth, part in enumerate(attribute_path.split(".")):
        if not hasattr(function, part):
            owner = module_name if depth == 0 else f"{module_name}:{'.'.join(attribute_path.split('.')[:depth])}"
            known = [name for name in dir(function) if not name.startswith("_")]
            close = closest_names(part, known)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ProblemError(f"factory '{spec}': '{owner}' has no attribute '{part}'{hint}")
        function = getattr(function, part)
    if not callable(function):
        raise ProblemError(
            f"factory '{spec}': '{attribute_path}' is a {type(function).__name__}, "
            "but must be a callable that returns a workload"
        )
    return _Factory(spec, function)


def _import_module(spec: str, module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except MissingDependencyError:
        raise
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ProblemError(
                f"factory '{spec}': there is no module named '{missing}' "
                "(is it installed, or on PYTHONPATH?)"
            ) from e
        raise ProblemError(
            f"factory '{spec}': importing '{module_name}' failed: it needs the module "
            f"'{missing}', which is not installed"
        ) from e
    except Exception as e:  # any error in the user's module while it is imported
        raise ProblemError(
            f"factory '{spec}': importing '{module_name}' raised {type(e).__name__}: {e}"
        ) from e


def load_workload(spec: str, *args: Any, **kwargs: Any) -> "Workload":
    """``load_factory(spec)(*args, **kwargs)``: import, call and check a factory."""
    return load_factory(spec)(*args, **kwargs)


def as_workload(made: Any, *, source: str = "the workload") -> "Workload":
    """Accept a `Workload`, a tuple ``(model, make_batch, loss_fn)`` or an object
    with attributes ``model``, ``make_batch`` and ``loss_fn``; anything else is a
    `ProblemError` that says what was given."""
    from thrifty.perfmodels.zoo import Workload

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
    torch = _import_torch()
    if not isinstance(model, torch.nn.Module):
        raise ProblemError(f"{source}: model is a {type(model).__name__}, but must be a torch.nn.Module")
    for name, value in (("make_batch", make_batch), ("loss_fn", loss_fn)):
        if not callable(value):
            raise ProblemError(f"{source}: {name} is a {type(value).__name__}, but must be callable")
    return made if isinstance(made, Workload) else Workload(model, make_batch, loss_fn)


# --- devices and machines -----------------------------------------------------------


def resolve_device(device: str) -> Literal["cpu", "cuda"]:
    """``auto`` is ``cuda`` when torch sees a GPU, else ``cpu``."""
    torch = _import_torch()
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
    torch = _import_torch()
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
    torch = _import_torch()
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


# --- batches ------------------------------------------------------------------------


def geometric_batches(max_batch: int, start: int = 1) -> list[int]:
    """``start, 2*start, 4*start, ...`` up to `max_batch`, and `max_batch` itself."""
    if max_batch < 1 or start < 1:
        raise ProblemError(f"max_batch is {max_batch}, but must be at least 1")
    out = []
    batch = start
    while batch < max_batch:
        out.append(batch)
        batch *= 2
    out.append(max_batch)
    return out


def _checked_batches(batches: Sequence[int]) -> list[int]:
    out = sorted(set(batches))
    for batch in out:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ProblemError(f"batch {batch!r} is not a positive integer")
    if len(out) < 2:
        raise ProblemError(f"batches are {list(batches)}, but a profile needs two or more distinct batch sizes")
    return out


def _nearest_batch(batches: Sequence[int], target: int) -> int:
    # Nearest in log scale: 16 and 64 are equally far from 32.
    return min(batches, key=lambda b: (abs(math.log(b / target)), -b))


# --- clocks -------------------------------------------------------------------------


class _CpuClock:
    def mark(self) -> float:
        return time.perf_counter()

    def sync(self) -> None:
        pass

    def seconds(self, start: Any, end: Any) -> float:
        return end - start


class _CudaClock:
    """CUDA events on the current stream: they time the GPU's timeline, and
    `sync` before reading them."""

    def __init__(self, torch: Any):
        self.torch = torch

    def mark(self) -> Any:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3


# --- the measuring loop -------------------------------------------------------------


@dataclass
class _Trainer:
    """The copied model, loss and optimizer on the profiling device."""

    torch: Any
    model: Any
    loss_fn: Any
    optimizer: Any
    make_batch: Callable[[int], Any]
    device: str
    clock: Any

    def batch(self, size: int) -> tuple[Any, Any]:
        try:
            inputs, targets = self.make_batch(size)
        except Exception as e:
            raise ProblemError(f"make_batch({size}) raised {type(e).__name__}: {e}") from e
        return _to_device(inputs, self.device), _to_device(targets, self.device)

    def iteration(self, inputs: Any, targets: Any) -> tuple[Any, Any, Any, Any]:
        """One training iteration; returns the clock marks before forward,
        before backward, after backward and after the optimizer step."""
        clock = self.clock
        clock.sync()
        t0 = clock.mark()
        loss = self.loss_fn(self.model(inputs), targets)
        t1 = clock.mark()
        loss.backward()
        t2 = clock.mark()
        self.optimizer.step()
        # Zero the gradients in place rather than freeing them: a trainer keeps its
        # gradient memory (a CUDA caching allocator, DDP's buckets), whereas freeing
        # 10 MB per iteration on CPU costs page faults whose number depends on
        # glibc's malloc history, not on the model.
        self.optimizer.zero_grad(set_to_none=False)
        t3 = clock.mark()
        clock.sync()
        return t0, t1, t2, t3


def _to_device(value: Any, device: str) -> Any:
    if hasattr(value, "to"):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class _Samples:
    forward_s: list[float]
    backward_s: list[float]
    step_s: list[float]

    def extend(self, more: "_Samples") -> None:
        self.forward_s.extend(more.forward_s)
        self.backward_s.extend(more.backward_s)
        self.step_s.extend(more.step_s)


def _measure_latency(trainer: _Trainer, batch: int, warmup: int, repeats: int, tick: Callable[[], None]) -> _Samples:
    inputs, targets = trainer.batch(batch)
    forward, backward, step = [], [], []
    for i in range(warmup + repeats):
        t0, t1, t2, t3 = trainer.iteration(inputs, targets)
        if i >= warmup:
            forward.append(trainer.clock.seconds(t0, t1))
            backward.append(trainer.clock.seconds(t1, t2))
            step.append(trainer.clock.seconds(t2, t3))
        tick()
    return _Samples(forward, backward, step)


def _measure_readiness(
    trainer: _Trainer, batch: int, repeats: int, tick: Callable[[], None]
) -> tuple[dict[str, float], list[float]]:
    """Mean ``ready_frac`` per parameter name (parameters whose gradient never
    became ready are left out) and the backward durations of the hooked runs."""
    clock = trainer.clock
    stamps: dict[str, Any] = {}

    def stamp_when_ready(name: str) -> Callable[[Any], None]:
        def hook(_parameter: Any) -> None:
            stamps[name] = clock.mark()

        return hook

    handles = [
        parameter.register_post_accumulate_grad_hook(stamp_when_ready(name))
        for name, parameter in trainer.model.named_parameters()
        if parameter.requires_grad
    ]
    inputs, targets = trainer.batch(batch)
    fractions: dict[str, list[float]] = {}
    backward: list[float] = []
    try:
        for i in range(1 + repeats):  # one warm-up run with the hooks in place
            stamps.clear()
            _t0, t1, t2, _t3 = trainer.iteration(inputs, targets)
            if i == 0:
                tick()
                continue
            duration = clock.seconds(t1, t2)
            backward.append(duration)
            for name, stamp in stamps.items():
                frac = clock.seconds(t1, stamp) / duration if duration > 0 else 0.0
                fractions.setdefault(name, []).append(min(1.0, max(0.0, frac)))
            tick()
    finally:
        for handle in handles:
            handle.remove()
    return {name: statistics.fmean(values) for name, values in fractions.items()}, backward


def measure_ddp_overhead(factory: str, device: str, batch: int, warmup: int, repeats: int, threads: int) -> float:
    """Seconds PyTorch DDP adds to an iteration besides the allreduce: the
    median, over `repeats` interleaved pairs at `batch`, of a DDP iteration on
    a world of one process minus a plain one (bucket copies with its default
    ``gradient_as_bucket_view=False``, autograd hooks, collective launches).
    Runs in a spawned process (gloo, or NCCL on CUDA, with an in-memory
    store: no network), which loads the workload from `factory`."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_ddp_overhead_worker, args=(factory, device, batch, warmup, repeats, threads, out))
    [seconds] = gather_children([proc], out, "the DDP overhead measurement")
    return seconds


def _ddp_overhead_worker(factory: str, device: str, batch: int, warmup: int, repeats: int, threads: int,
                         out: Any) -> None:
    def measure() -> float:
        torch = _import_torch()
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        torch.set_num_threads(threads)
        dist.init_process_group("nccl" if device == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
        workload = load_workload(factory)
        plain = make_trainer(torch, workload, device, None)
        wrapped = make_trainer(torch, workload, device, None)
        wrapped = dataclasses.replace(wrapped, model=DistributedDataParallel(wrapped.model))
        inputs, targets = plain.batch(batch)

        def seconds(trainer: _Trainer) -> float:
            t0, _t1, _t2, t3 = trainer.iteration(inputs, targets)
            return trainer.clock.seconds(t0, t3)

        def pairs() -> list[float]:
            differences = []
            for i in range(warmup + repeats):
                first, second = (plain, wrapped) if i % 2 == 0 else (wrapped, plain)
                a, b = seconds(first), seconds(second)
                if i >= warmup:
                    differences.append(b - a if first is plain else a - b)
            return differences

        overhead = max(0.0, statistics.median(timed_without_gc(pairs)))
        dist.destroy_process_group()
        return overhead

    report_from_child(out, measure)


def report_from_child(out: Any, body: Callable[[], Any], on_error: Callable[[], None] | None = None) -> None:
    """In a spawned child: put `body()`'s result on `out`, or its traceback (so
    the parent never waits for a dead child), then leave without interpreter
    teardown (gloo may abort in it) once the result has reached the pipe."""
    try:
        out.put(body())
    except BaseException:
        import traceback

        if on_error is not None:
            on_error()
        out.put(traceback.format_exc())
    finally:
        out.close()
        out.join_thread()
        os._exit(0)


def gather_children(procs: list[Any], out: Any, what: str, on_wait: Callable[[], None] | None = None,
            timeout_s: float = 600.0) -> list[Any]:
    """Start `procs` and collect one result from each on `out`; a child's
    traceback, or children that stop or go quiet for `timeout_s` without
    reporting, is a `ProblemError` naming `what`. `on_wait` runs while waiting."""
    import queue

    for proc in procs:
        proc.start()
    results: list[Any] = []
    quiet_since = time.monotonic()
    try:
        while len(results) < len(procs):
            try:
                value = out.get(timeout=0.25)
            except queue.Empty:
                if on_wait is not None:
                    on_wait()
                if not any(proc.is_alive() for proc in procs) and out.empty():
                    raise ProblemError(f"{what} stopped without reporting") from None
                if time.monotonic() - quiet_since > timeout_s:
                    raise ProblemError(f"{what} stopped answering") from None
                continue
            if isinstance(value, str):
                raise ProblemError(f"{what} failed:\n{value}")
            results.append(value)
            quiet_since = time.monotonic()
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    return results


def _iteration_fits(trainer: _Trainer, batch: int) -> bool:
    """Whether one training iteration at `batch` runs without a CUDA OOM."""
    torch = trainer.torch
    try:
        inputs, targets = trainer.batch(batch)
        trainer.iteration(inputs, targets)
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        trainer.optimizer.zero_grad(set_to_none=True)
        inputs = targets = None  # drop the batch before the cache is emptied
        gc.collect()
        torch.cuda.empty_cache()


def search_max_batch(fits: Callable[[int], bool], cap: int) -> int | None:
    """The largest batch in ``[1, cap]`` for which `fits` holds, assuming it is
    monotone: double until it fails (or reaches `cap`), then bisect (Srifty 4.1).
    ``None`` when not even batch 1 fits."""
    if not fits(1):
        return None
    good, bad = 1, None
    while bad is None:
        trial = min(good * 2, cap)
        if trial == good:
            return good
        if fits(trial):
            good = trial
        else:
            bad = trial
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def estimate_max_batch(trainer: _Trainer, memory_limit_bytes: int, probe_batches: tuple[int, int] = (2, 8)) -> int:
    """The largest batch whose estimated training memory is within the limit.

    memory(B) = 3 * parameter bytes (weights, gradients, momentum)
                + saved activations(B) + inputs(B),
    with the activations that autograd saves for backward measured at two small
    batches and extrapolated linearly. It leaves out temporaries, so it is an
    optimistic estimate: give the limit with some headroom.
    """
    torch = trainer.torch
    parameter_storages = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    state_bytes = 3 * sum(p.numel() * p.element_size() for p in trainer.model.parameters())

    def batch_bytes(batch: int) -> int:
        inputs, targets = trainer.batch(batch)
        seen: dict[int, int] = {}
        for tensor in (inputs, targets):
            if hasattr(tensor, "untyped_storage"):
                seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()

        def pack(tensor: Any) -> Any:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in parameter_storages:
                seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            trainer.loss_fn(trainer.model(inputs), targets)
        return sum(seen.values())

    small, large = probe_batches
    bytes_small, bytes_large = batch_bytes(small), batch_bytes(large)
    per_sample = max(1.0, (bytes_large - bytes_small) / (large - small))
    fixed = state_bytes + max(0.0, bytes_small - per_sample * small)
    if fixed + per_sample > memory_limit_bytes:
        raise ProblemError(
            f"the memory limit is {memory_limit_bytes / 2**30:.3g} GiB, but the model needs an "
            f"estimated {(fixed + per_sample) / 2**30:.3g} GiB at batch 1"
        )
    return int((memory_limit_bytes - fixed) // per_sample)


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _point(batch: int, samples: _Samples) -> ProfilePoint:
    forward, forward_sd = _mean_sd(samples.forward_s)
    backward, backward_sd = _mean_sd(samples.backward_s)
    return ProfilePoint(
        batch=batch,
        forward_s=forward,
        backward_s=backward,
        forward_sd_s=forward_sd,
        backward_sd_s=backward_sd,
        repeats=len(samples.forward_s),
    )


def _python_command(model_name: str, **settings: Any) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in settings.items() if v is not None)
    return f"thrifty.perfmodels.profiler.profile_workload(workload, model_name={model_name!r}, {shown})"


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


# --- the profiler -------------------------------------------------------------------


def profile_workload(
    workload: "Workload | Any",
    *,
    model_name: str,
    batches: Sequence[int] | None = None,
    max_batch: int | None = None,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    rounds: int = DEFAULT_ROUNDS,
    threads: int = 1,
    device: str = "auto",
    ready_batch: int | None = None,
    ready_repeats: int | None = None,
    memory_limit_bytes: int | None = None,
    device_name: str | None = None,
    make_optimizer: Callable[[Any], Any] | None = None,
    command: str | None = None,
    progress: bool = True,
    colocated: int = 1,
    factory: str | None = None,
) -> ComputeProfile:
    """Measure `workload` on the local device and return its compute profile.

    batches: the batch sizes to time (two or more); by default ``1, 2, 4, ...``
        up to `max_batch` (default 256 on CPU; on CUDA the largest that fits,
        searched up to 4096). Give `batches` or `max_batch`, not both.
    repeats: timed iterations per batch size, taken in `rounds` passes over the
        sweep so that a burst of noise from elsewhere on the machine spreads
        over all batch sizes instead of skewing one; `warmup` untimed
        iterations precede each batch's timed ones in every pass.
    threads: ``torch.set_num_threads`` for the run (restored afterwards).
    device: ``auto``, ``cpu`` or ``cuda``; `device_name` overrides the profile's
        device key (default ``cpu`` or the GPU model, e.g. ``A100``).
    ready_batch, ready_repeats: where and how often the gradient-ready trace is
        taken (default: the swept batch nearest 32, `repeats` times).
    memory_limit_bytes: on CPU, cap `max_batch` by the estimated training
        memory (`estimate_max_batch`); the sweep stops below it.
    make_optimizer: ``params -> optimizer``; default SGD, momentum 0.9.
    command: the provenance command (the CLI passes its command line).
    factory: the workload's ``module:function`` spec: with it, processes
        spawned to measure DDP's overhead (and co-located workers) load the
        workload themselves; without it ``ddp_overhead_s`` is 0 (not measured).
    colocated: on CPU, also measure the sweep in this many processes at once
        (see the module docstring); needs `factory` and the default optimizer.
    """
    torch = _import_torch()
    workload = as_workload(workload)
    _check_settings(batches, max_batch, repeats, warmup, rounds, threads, ready_repeats, memory_limit_bytes)
    resolved = resolve_device(device)
    _check_colocated(colocated, factory, resolved, make_optimizer)
    ready_repeats = repeats if ready_repeats is None else ready_repeats
    rounds = min(rounds, repeats)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        trainer = make_trainer(torch, workload, resolved, make_optimizer)
        with _progress(progress) as bar:
            sweep, top, top_source = _plan_sweep(trainer, batches, max_batch, memory_limit_bytes, bar)
            ready_at = ready_batch if ready_batch is not None else _nearest_batch(sweep, READY_BATCH_TARGET)
            if ready_at > top:
                raise ProblemError(f"ready_batch {ready_at} is beyond the memory limit max_batch {top}")
            total = len(sweep) * (rounds * warmup + repeats) + 1 + ready_repeats
            task = bar.add_task(f"profiling {model_name}", total=total)

            def report(doing: str) -> Callable[[], None]:
                bar.update(task, description=f"profiling {model_name}: {doing}")
                return lambda: bar.advance(task)

            samples = _measure_sweep(trainer, sweep, warmup, repeats, rounds, report)
            tick = report(f"gradient-ready trace at batch {ready_at}")
            ready, hooked_backward = timed_without_gc(
                lambda: _measure_readiness(trainer, ready_at, ready_repeats, tick))
            ddp_s = 0.0
            if factory is not None:
                bar.update(task, description=f"profiling {model_name}: DDP overhead at batch {ready_at}")
                ddp_s = measure_ddp_overhead(factory, resolved, ready_at, warmup, repeats, threads)
            shared = None
            if colocated > 1:
                shared = measure_colocated(factory, sweep, colocated, warmup, repeats, rounds, threads, bar)
    finally:
        torch.set_num_threads(previous_threads)

    layers, unused = _layers(trainer.model, ready)
    extra: dict[str, Any] = {
        "threads": threads,
        "warmup": warmup,
        "rounds": rounds,
        "max_batch_source": top_source,
        "optimizer": _describe_optimizer(trainer.optimizer),
        "ready_batch": ready_at,
        "ready_repeats": ready_repeats,
    }
    if ready_at in samples:
        # How much the hooks slowed the backward pass; large values make the trace suspect.
        plain_backward = statistics.fmean(samples[ready_at].backward_s)
        extra["ready_hook_overhead_frac"] = round(statistics.fmean(hooked_backward) / plain_backward - 1.0, 4)
    if unused:
        extra["unused_parameters"] = unused
    if command is None:
        command = _python_command(
            model_name, batches=list(sweep), repeats=repeats, warmup=warmup, rounds=rounds, threads=threads,
            device=device
        )
    return ComputeProfile(
        model=model_name,
        device=device_name or device_label(resolved),
        provenance=Provenance(
            kind="measured",
            command=command,
            machine=machine_description(resolved, threads),
            date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        ),
        max_batch=top,
        step_s=statistics.fmean(v for s in samples.values() for v in s.step_s),
        points=[_point(batch, s) for batch, s in samples.items()],
        layers=layers,
        buffer_bytes=sum(b.numel() * b.element_size() for b in trainer.model.buffers()),
        ddp_overhead_s=ddp_s,
        colocated=shared,
        extra=extra,
    )


def _check_colocated(colocated: int, factory: str | None, device: str, make_optimizer: Any) -> None:
    if isinstance(colocated, bool) or not isinstance(colocated, int) or colocated < 1:
        raise ProblemError(f"colocated is {colocated!r}, but must be an integer of at least 1")
    if colocated == 1:
        return
    if device != "cpu":
        raise ProblemError("colocated workers share a host's CPU cores; on CUDA each worker has its own GPU")
    if factory is None:
        raise ProblemError("colocated workers load the workload themselves: give its factory ('module:function')")
    if make_optimizer is not None:
        raise ProblemError("colocated workers use the default optimizer; leave make_optimizer out")


def measure_colocated(
    factory: str, sweep: list[int], workers: int, warmup: int, repeats: int, rounds: int, threads: int, bar: Any
) -> ColocatedPoints:
    """The latency sweep measured in `workers` processes at once (see the
    module docstring): each point pools the samples of every process."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, ticks, out = ctx.Barrier(workers), ctx.Value("i", 0), ctx.Queue()
    procs = [ctx.Process(target=_colocated_worker,
                         args=(factory, sweep, warmup, repeats, rounds, threads, barrier, ticks, out))
             for _ in range(workers)]
    per_worker = len(sweep) * (rounds * warmup + repeats)
    task = bar.add_task(f"{workers} co-located workers", total=per_worker * workers)
    results = gather_children(procs, out, "a co-located worker",
                              on_wait=lambda: bar.update(task, completed=ticks.value))
    bar.update(task, completed=per_worker * workers)
    pooled = {b: _Samples([], [], []) for b in sweep}
    for result in results:
        for b, samples in result.items():
            pooled[b].extend(samples)
    return ColocatedPoints(
        workers=workers,
        host_cores=os.cpu_count(),
        step_s=statistics.fmean(v for s in pooled.values() for v in s.step_s),
        points=[_point(b, s) for b, s in pooled.items()],
    )


def _colocated_worker(
    factory: str, sweep: list[int], warmup: int, repeats: int, rounds: int, threads: int,
    barrier: Any, ticks: Any, out: Any,
) -> None:
    """One co-located process: the sweep, in step with the others."""
    def tick() -> None:
        with ticks.get_lock():
            ticks.value += 1

    def report(_doing: str) -> Callable[[], None]:
        barrier.wait(timeout=600)  # every process starts this batch together
        return tick

    def sweep_in_step() -> dict[int, _Samples]:
        torch = _import_torch()
        torch.set_num_threads(threads)
        trainer = make_trainer(torch, load_workload(factory), "cpu", None)
        return _measure_sweep(trainer, sweep, warmup, repeats, rounds, report)

    report_from_child(out, sweep_in_step, on_error=barrier.abort)


def _measure_sweep(
    trainer: _Trainer,
    sweep: list[int],
    warmup: int,
    repeats: int,
    rounds: int,
    report: Callable[[str], Callable[[], None]],
) -> dict[int, _Samples]:
    """Latency samples per batch: `repeats` timed iterations per batch, split
    over `rounds` ascending passes over the sweep."""
    # The first iterations of a process pay one-time costs (lazy initialization,
    # allocator growth); paying them at the largest batch grows the allocator
    # once for every batch of the sweep.
    _first_iterations(trainer, sweep[-1])
    samples = {batch: _Samples([], [], []) for batch in sweep}
    for round_index, round_repeats in enumerate(_split(repeats, rounds)):
        for batch in sweep:
            tick = report(f"batch {batch}, pass {round_index + 1} of {rounds}")
            measured = timed_without_gc(  # the lambda runs now, within this iteration
                lambda b=batch: _measure_latency(trainer, b, warmup, round_repeats, tick))  # noqa: B023
            samples[batch].extend(measured)
    return samples


def _split(total: int, parts: int) -> list[int]:
    """`total` as `parts` near-equal positive counts, larger ones first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _check_settings(
    batches: Sequence[int] | None,
    max_batch: int | None,
    repeats: int,
    warmup: int,
    rounds: int,
    threads: int,
    ready_repeats: int | None,
    memory_limit_bytes: int | None,
) -> None:
    if batches is not None and max_batch is not None:
        raise ProblemError("give either batches or max_batch, not both")
    for name, value, least in (
        ("repeats", repeats, 1),
        ("warmup", warmup, 0),
        ("rounds", rounds, 1),
        ("threads", threads, 1),
        ("ready_repeats", ready_repeats, 1),
        ("max_batch", max_batch, 1),
        ("memory_limit_bytes", memory_limit_bytes, 1),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ProblemError(f"{name} is {value!r}, but must be an integer of at least {least}")


def make_trainer(torch: Any, workload: "Workload", device: str,
                 make_optimizer: Callable[[Any], Any] | None) -> _Trainer:
    """A timed training step for `workload` on `device` (a copy of its model; SGD unless
    `make_optimizer` is given), shared by `thrifty profile` and `thrifty profile-scaling`."""
    try:
        model = copy.deepcopy(workload.model)
        loss_fn = copy.deepcopy(workload.loss_fn) if isinstance(workload.loss_fn, torch.nn.Module) else workload.loss_fn
    except Exception as e:
        raise ProblemError(
            f"the model cannot be copied for profiling ({type(e).__name__}: {e}); "
            "the profiler trains a copy so that the caller's weights stay as they were"
        ) from e
    model = model.to(device).train()
    if isinstance(loss_fn, torch.nn.Module):
        loss_fn = loss_fn.to(device)
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise ProblemError("the model has no parameters that require gradients: there is nothing to train")
    if make_optimizer is None:
        optimizer = torch.optim.SGD(parameters, lr=DEFAULT_LR, momentum=DEFAULT_MOMENTUM)
    else:
        optimizer = make_optimizer(parameters)
    clock = _CudaClock(torch) if device == "cuda" else _CpuClock()
    return _Trainer(torch, model, loss_fn, optimizer, workload.make_batch, device, clock)


def _plan_sweep(
    trainer: _Trainer,
    batches: Sequence[int] | None,
    max_batch: int | None,
    memory_limit_bytes: int | None,
    bar: Any,
) -> tuple[list[int], int, str]:
    """The batches to time, ``max_batch`` and where it came from."""
    if batches is not None:
        sweep = _checked_batches(batches)
        cap = sweep[-1]
    else:
        cap = max_batch or (DEFAULT_CUDA_MAX_BATCH if trainer.device == "cuda" else DEFAULT_CPU_MAX_BATCH)
        sweep = []
    if trainer.device == "cuda" and memory_limit_bytes is not None:
        raise ProblemError("a memory limit applies on CPU only; on CUDA the largest batch that fits is searched")
    if trainer.device == "cuda":
        task = bar.add_task("searching the largest batch that fits", total=None)
        found = search_max_batch(lambda b: _iteration_fits(trainer, b), cap)
        bar.remove_task(task)
        if found is None:
            raise ProblemError("not even batch 1 fits in the GPU's memory")
        top, source = found, ("cap" if found == cap else "oom_search")
    elif memory_limit_bytes is not None:
        top, source = estimate_max_batch(trainer, memory_limit_bytes), "memory_estimate"
    else:
        top, source = cap, "swept"
    if not sweep:
        sweep = geometric_batches(min(cap, top))
    kept = [b for b in sweep if b <= top]
    if len(kept) < 2:
        raise ProblemError(
            f"only batches {kept} of {sweep} are within the memory limit max_batch {top}; "
            "a profile needs two or more"
        )
    return kept, top, source


def _first_iterations(trainer: _Trainer, batch: int, count: int = 2) -> None:
    inputs, targets = trainer.batch(batch)
    for _ in range(count):
        trainer.iteration(inputs, targets)


def timed_without_gc(measure: Callable[[], Any]) -> Any:
    """Run `measure` with the garbage collector paused, so that a collection
    does not land inside a timed iteration."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return measure()
    finally:
        if was_enabled:
            gc.enable()


def _layers(model: Any, ready: dict[str, float]) -> tuple[list[LayerGrad], list[str]]:
    """Gradients in the order they become ready; ties keep reverse forward order
    (later parameters first), as the backward pass visits them."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    reverse_rank = {name: -i for i, (name, _p) in enumerate(named)}
    layers = [
        LayerGrad(name=name, grad_bytes=p.numel() * p.element_size(), ready_frac=ready[name])
        for name, p in named
        if name in ready and p.numel() > 0
    ]
    layers.sort(key=lambda layer: (layer.ready_frac, reverse_rank[layer.name]))
    unused = [name for name, _p in named if name not in ready]
    return layers, unused


def _describe_optimizer(optimizer: Any) -> str:
    group = optimizer.param_groups[0]
    shown = {k: group[k] for k in ("lr", "momentum", "weight_decay") if k in group}
    return f"{type(optimizer).__name__}({', '.join(f'{k}={v}' for k, v in shown.items())})"
