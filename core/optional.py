"""The one way thrifty imports a module it may not find: an optional heavy
dependency (torch, boto3, ray, xgboost), a dependency whose absence only loses
an extra, or a module a user names. Library code catches no ImportError
anywhere else (tests/test_optional_imports.py checks it).

- `require`: a dependency the caller needs: imported, or a
  `MissingDependencyError` with the install command of the extra that
  provides it (or, for a dependency of every install, "reinstall thrifty").
  Call it where the dependency is used, never at the top of a module on the
  path of ``thrifty solve``, so that the planner loads none of them.
- `try_import`: a dependency the caller can do without (a plot, a thread
  limit): the module, or None.
- `import_named`: a module a user names (a trainer, a workload): imported, or
  a `ProblemError` that says whether it, or a module it needs, is missing.
- `import_file`: a Python file a user names (``path/to/train.py:train``,
  `file_spec`, `absolute_spec`): imported by its path, under a module name
  that every process derives from the path alone.
- `lazy_exports`: a package's public names imported on first use (PEP 562).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from thrifty.core.errors import MissingDependencyError, ProblemError

__all__ = ["require", "try_import", "import_named", "file_spec", "absolute_spec", "import_file", "lazy_exports"]


def require(module: str, extra: str | None, package: str | None = None) -> ModuleType:
    """``importlib.import_module(module)``; when it is not installed, a
    `MissingDependencyError` naming `package` (default: the top-level name of
    `module`) and ``pip install 'thrifty[extra]'``, or, with `extra` None (a
    dependency of every install, such as OR-Tools), saying that the install
    is broken."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(package or module.partition(".")[0], extra) from e


def try_import(module: str) -> ModuleType | None:
    """``importlib.import_module(module)``, or None when it (or a module it
    imports) is not installed: for a dependency whose absence costs only an
    extra the caller can skip. A dependency the caller needs is `require`'s."""
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def import_named(module: str, what: str) -> ModuleType:
    """The module a user named, for `what` (``factory 'pkg.mod:f'``), or a
    `ProblemError` starting with `what`: no such module (not installed, or not
    on PYTHONPATH), a module it imports is not installed, or what its import
    raised (any error in the user's code while it is imported)."""
    try:
        return importlib.import_module(module)
    except MissingDependencyError:
        raise
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing and (module == missing or module.startswith(missing + ".")):
            raise ProblemError(f"{what}: there is no module named '{missing}' "
                               "(is it installed, or on PYTHONPATH?)") from e
        raise ProblemError(f"{what}: importing '{module}' failed: it needs the module "
                           f"'{missing}', which is not installed") from e
    except Exception as e:  # any error in the user's module while it is imported
        raise ProblemError(f"{what}: importing '{module}' raised {type(e).__name__}: {e}") from e


_FILE_SPEC = re.compile(r"^(.+\.py):([^:]+)$")


def file_spec(spec: str) -> tuple[str, str] | None:
    """``(path, attribute)`` when `spec` names a function of a Python file,
    ``path/to/train.py:train`` (the part before the last colon ends in
    ``.py``); None for ``package.module:function`` and anything else."""
    match = _FILE_SPEC.match(spec.strip()) if isinstance(spec, str) else None
    return (match.group(1), match.group(2)) if match else None


def absolute_spec(spec: str, base: str | Path | None = None) -> str:
    """`spec` with the path of a file spec made absolute, read from the folder
    `base` (default the current folder), so that the name means the same file
    in every process and from every folder; a module spec is `spec` itself."""
    named = file_spec(spec)
    if named is None:
        return spec.strip()
    path, attribute = named
    return f"{os.path.abspath(Path(base or '.') / Path(path).expanduser())}:{attribute}"


def import_file(path: str | Path, what: str) -> ModuleType:
    """The Python file at `path`, imported by its path for `what` (``job
    'train.py:train'``), or a `ProblemError` starting with `what`: no such
    file, or what its import raised. Its module name comes from the absolute
    path alone (``_thrifty_file_<stem>_<hash>``), so every process that
    imports the same file gives it the same name (what pickle needs), and
    the module is imported once per process; the file's folder is appended
    to ``sys.path`` (after every installed package, which it never shadows),
    so the file imports the modules beside it, as under ``python FILE.py``."""
    resolved = Path(os.path.abspath(Path(path).expanduser()))
    if not resolved.is_file():
        raise ProblemError(f"{what}: there is no file {str(path)!r}" +
                           (f" (from {os.getcwd()})" if not Path(path).is_absolute() else ""))
    stem = re.sub(r"\W", "_", resolved.stem)
    name = f"_thrifty_file_{stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    if str(resolved.parent) not in sys.path:
        sys.path.append(str(resolved.parent))
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ProblemError(f"{what}: {str(path)!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: its classes pickle by this name, its dataclasses find it
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[name]
        if isinstance(e, MissingDependencyError) or not isinstance(e, Exception):
            raise
        if isinstance(e, ModuleNotFoundError):
            raise ProblemError(f"{what}: importing {str(path)!r} failed: it needs the module '{e.name}', which "
                               "is not installed") from e
        raise ProblemError(f"{what}: importing {str(path)!r} raised {type(e).__name__}: {e}") from e
    return module


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) that import a
    name's module only when the name (``exports``: name -> module) is first
    used: the package's public names cost nothing to import. A module is
    ``package.<module>`` (``allreduce.derived`` is a subpackage's), or, when
    it starts with ``thrifty.``, that module itself. The only way a package
    of thrifty exports names lazily."""
    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        path = module if module.startswith("thrifty.") else f"{package}.{module}"
        return getattr(importlib.import_module(path), name)

    def dir_() -> list[str]:
        return sorted(exports)

    return getattr_, dir_
