"""The compute profiles measured from a job itself, keyed by the job's code
and arguments, and where they are kept.

A job (``mypkg.jobs:train`` or ``path/to/train.py:train``, a loop function
or a `Trainer` factory) is profiled by ``thrifty profile mypkg.jobs:train`` on each machine type it may
run on; a training problem that names the job (``"job": "mypkg.jobs:train"``,
optional ``"job_args"``) is priced with those profiles. A profile belongs to
one version of the job: its key (`job_key`) hashes the source file of the
job's module (or the job's file), the job's name and its JSON arguments, so an edited loop (or
other arguments) misses the cache instead of being priced with another
loop's times.

The cache (`cache_root`): ``$THRIFTY_PROFILE_CACHE`` when set, else
``$XDG_CACHE_HOME/thrifty/profiles``, else ``~/.cache/thrifty/profiles``.
Under it, ``<key>/type-<instance type>.json`` is a profile measured on that
instance type (``--instance-type`` or ``--cluster``), and
``<key>/device-<device>.json`` one measured on a device without naming a
type, which prices every type of that device (`profiles_for`). Each is a
``thrifty.compute_profile/1`` file, whose ``extra.job`` names the job, its
arguments and its key.

Computing a key reads the module's source file, found on ``sys.path``
without importing the module or its packages (`module_source`): ``thrifty
solve`` stays free of the job's imports (torch among them).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from thrifty.core.errors import ProblemError
from thrifty.core.io import write_json
from thrifty.core.optional import file_spec

__all__ = ["CACHE_ENV", "cache_root", "module_source", "job_key", "profile_path", "profiles_for",
           "store_profile", "measure_command"]

CACHE_ENV = "THRIFTY_PROFILE_CACHE"


def cache_root() -> Path:
    """The folder of the job profile cache (module docstring)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "thrifty" / "profiles"


def module_source(module: str) -> Path:
    """The source file of `module` (dotted), found package by package on
    ``sys.path`` as the import system would, but without importing anything
    (``importlib.util.find_spec`` would import the parent packages)."""
    if module in sys.modules and getattr(sys.modules[module], "__file__", None):
        return Path(sys.modules[module].__file__)  # type: ignore[arg-type]
    parts = module.split(".")
    search: list[str] | None = None
    spec = None
    for depth in range(len(parts)):
        name = ".".join(parts[:depth + 1])
        spec = PathFinder.find_spec(name, search)
        if spec is None:
            raise ProblemError(f"module '{name}' is not found on the Python path (sys.path)")
        if depth < len(parts) - 1:
            locations = spec.submodule_search_locations
            if locations is None:
                raise ProblemError(f"'{name}' is a module, not a package: '{module}' cannot be in it")
            search = list(locations)
    assert spec is not None
    if not spec.origin or not Path(spec.origin).is_file():
        raise ProblemError(f"module '{module}' has no source file to key its profiles by")
    return Path(spec.origin)


def job_key(job: str, args: Mapping[str, Any] | None = None) -> str:
    """The cache key of a job: a hash of its module's source file, its name
    (``module:function``; for a file's job, ``path/to/file.py:function``, the
    file's name and the function: the same file keys alike from any folder)
    and its arguments as sorted JSON."""
    in_file = file_spec(job) if isinstance(job, str) else None
    if in_file is not None:
        path = Path(in_file[0]).expanduser()
        if not path.is_file():
            raise ProblemError(f"job '{job}': there is no file {in_file[0]!r}", path="job")
        source, name = path, f"{path.name}:{in_file[1]}"
    elif isinstance(job, str) and job.count(":") == 1 and all(job.split(":")):
        source, name = module_source(job.split(":")[0].strip()), job.strip()
    else:
        raise ProblemError(f"job is {job!r}, but must be 'package.module:function' or 'path/to/file.py:function'",
                           path="job")
    try:
        arguments = json.dumps(dict(args or {}), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ProblemError(f"job arguments must be JSON values: {e}", path="job_args") from None
    digest = hashlib.sha256()
    for part in (source.read_bytes(), name.encode(), arguments.encode()):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()[:20]


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def profile_path(key: str, *, instance_type: str | None = None, device: str | None = None) -> Path:
    """Where the profile of the job `key` on `instance_type` (else on `device`) is kept."""
    if (instance_type is None) == (device is None):
        raise ValueError("give one of instance_type and device")
    name = f"type-{_safe(instance_type)}" if instance_type is not None else f"device-{_safe(device or '')}"
    return cache_root() / key / f"{name}.json"


def store_profile(document: Mapping[str, Any], key: str, *, instance_type: str | None = None,
                  device: str | None = None) -> Path:
    """Write a profile document into the cache (atomically); its path."""
    path = profile_path(key, instance_type=instance_type, device=device)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, dict(document))
    return path


def profiles_for(key: str, types: Mapping[str, str]) -> dict[str, Path]:
    """For each instance type of `types` (name -> its device), the cached
    profile that prices it: the one measured on that type, else the one
    measured on its device; a type with neither is left out."""
    out = {}
    for name, device in types.items():
        for path in (profile_path(key, instance_type=name), profile_path(key, device=device)):
            if path.is_file():
                out[name] = path
                break
    return out


def measure_command(job: str, args: Mapping[str, Any] | None, types: list[str]) -> str:
    """The commands that measure `job` (with `args`) for `types`: on a machine
    of each type, or on machines of them taken from a cluster."""
    import shlex

    extra = f" --job-args {shlex.quote(json.dumps(dict(args), sort_keys=True))}" if args else ""
    return (f"thrifty profile {job}{extra} --instance-type TYPE on a machine of each, or "
            f"thrifty profile {job}{extra} --cluster CLUSTER --instance-types {','.join(types)}")
