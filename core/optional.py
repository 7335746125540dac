"""The one way thrifty imports an optional heavy dependency (torch, boto3,
ray, xgboost): `require` imports it, or raises `MissingDependencyError` with
the install command of the extra that provides it. Call it where the
dependency is used, never at the top of a module on the path of
``thrifty solve``, so that the planner loads none of them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from thrifty.core.errors import MissingDependencyError

__all__ = ["require", "lazy_exports"]


def require(module: str, extra: str, package: str | None = None) -> ModuleType:
    """``importlib.import_module(module)``; when it is not installed, a
    `MissingDependencyError` naming `package` (default: the top-level name of
    `module`) and ``pip install 'thrifty[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(package or module.partition(".")[0], extra) from e


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` (PEP 562) that import
    ``package.<module>`` only when one of its names (``exports``: name ->
    module) is first used: the package's public names cost nothing to import."""
    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module '{package}' has no attribute '{name}'")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def dir_() -> list[str]:
        return sorted(exports)

    return getattr_, dir_
