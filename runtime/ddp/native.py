"""The C++ half of the gradient reweighting (`thrifty.runtime.ddp.reweight`):
the batch-weighted all-reduce as a DDP communication hook in C++
(``weighted_hook.cpp``), built on first use and kept.

Why: a Python communication hook costs a Python call per bucket and an
iteration, in the backward pass, on the critical path of the slowest rank.
Measured on a gloo world of one (tiny-mlp, batch 32): the Python hook cost
about 20 us an iteration over DDP without a hook, which on a model whose
iteration takes 1 ms is 2% of it. The C++ hook is PyTorch's own built-in
all-reduce hook with the rank's weight in place of the division by the
world size, so it costs what DDP's own averaging costs.

How: `torch.utils.cpp_extension` compiles the source once per torch and
Python version (20 to 40 s on a 2-core host; a C++ compiler and ninja are
needed) into ``$THRIFTY_EXTENSION_CACHE``, else
``$XDG_CACHE_HOME/thrifty/extensions``, else ``~/.cache/thrifty/extensions``,
in a folder named by a hash of the source and the versions; later
processes load the built module from there (10 ms). Concurrent builds (the
ranks of one host) wait on torch's build lock. Where the build fails (no
compiler), `weighted_hook` returns None with a warning, the Python hook
does the same weighting, and the failure is kept beside the build so that
no later process tries again; ``python -m thrifty.runtime.ddp.native``
builds it (again) and says where. ``THRIFTY_NATIVE_HOOK=0`` turns the C++
hook off.

Only host tensors (gloo) use it: on a GPU the hook's structure is the
built-in one's, but this project has no GPU to test it on, so GPUs keep the
Python hook.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import sys
from pathlib import Path
from typing import Any

from thrifty.core.optional import try_import

__all__ = ["NAME", "SOURCE", "ENABLE_ENV", "CACHE_ENV", "FAILED", "extension_dir", "weighted_hook", "main"]

NAME = "thrifty_weighted_hook"
SOURCE = Path(__file__).with_name("weighted_hook.cpp")
ENABLE_ENV = "THRIFTY_NATIVE_HOOK"
CACHE_ENV = "THRIFTY_EXTENSION_CACHE"
FAILED = "build-failed.txt"  # beside the build: why the last build failed

log = logging.getLogger(__name__)
_loaded: dict[str, Any] = {}


def extension_dir(torch_version: str) -> Path:
    """Where the hook is built for this source, `torch_version` and Python (module docstring)."""
    if os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV]).expanduser()
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "thrifty" / "extensions"
    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(f"{torch_version}|{sys.version}|{platform.machine()}".encode())
    return root / f"{NAME}-{key.hexdigest()[:16]}"


def weighted_hook() -> Any:
    """The built hook's module (its ``register_weighted_allreduce(reducer,
    group, weight)``), built first if need be; None where it is turned off
    or cannot be built. Loaded once a process."""
    if "module" in _loaded:
        return _loaded["module"]
    module = None
    if os.environ.get(ENABLE_ENV, "1") != "0":
        try:
            module = _load()
        except Exception as e:  # noqa: BLE001 - any build failure: the Python hook does the same
            lines = str(e).strip().splitlines()
            log.warning("the C++ reweighting hook is not built (%s: %s); the Python hook weighs the gradients "
                        "instead, about 20 us more an iteration (`python -m thrifty.runtime.ddp.native` builds it "
                        "again)", type(e).__name__, lines[-1] if lines else "")
    _loaded["module"] = module
    return module


def _load() -> Any:
    import torch

    folder = extension_dir(torch.__version__)
    built, failed = folder / f"{NAME}.so", folder / FAILED
    if built.exists() and not (folder / "lock").exists():  # built, and not being built again (torch's lock)
        spec = importlib.util.spec_from_file_location(NAME, built)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    if failed.exists():  # a build failed here before: not tried again in every rank of every world
        raise RuntimeError(f"the last build failed ({failed})")
    from torch.utils.cpp_extension import load

    folder.mkdir(parents=True, exist_ok=True)
    log.info("building the C++ reweighting hook in %s (once; 20 to 40 s)", folder)
    path = os.environ.get("PATH", "")
    ninja = try_import("ninja")  # the `torch` extra's ninja
    ninja_bin = getattr(ninja, "BIN_DIR", None) if ninja is not None else None
    if ninja_bin:  # torch looks for ninja on PATH, where a virtualenv's bin folder need not be
        os.environ["PATH"] = ninja_bin + os.pathsep + path
    try:
        return load(NAME, sources=[str(SOURCE)], build_directory=str(folder), extra_cflags=["-O2"], verbose=False)
    except Exception as e:
        failed.write_text(f"{type(e).__name__}: {e}\n")
        raise
    finally:
        os.environ["PATH"] = path


def main() -> int:
    """``python -m thrifty.runtime.ddp.native``: build the hook (again, after a failed build); exit 1 if it fails."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch

    (extension_dir(torch.__version__) / FAILED).unlink(missing_ok=True)
    module = weighted_hook()
    if module is None:
        return 1
    print(f"the C++ reweighting hook: {module.__file__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
