"""The one way thrifty imports an optional heavy dependency (torch, boto3,
ray, xgboost): `require` imports it, or raises `MissingDependencyError` with
the install command of the extra that provides it. Call it where the
dependency is used, never at the top of a module on the path of
``thrifty solve``, so that the planner loads none of them."""

from __future__ import annotations

import importlib
from types import ModuleType

from thrifty.datasets.errors import MissingDependencyError

__all__ = ["require"]


def require(module: str, extra: str, package: str | None = None) -> ModuleType:
    """``importlib.import_module(module)``; when it is not installed, a
    `MissingDependencyError` naming `package` (default: the top-level name of
    `module`) and ``pip install 'thrifty[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(package or module.partition(".")[0], extra) from e
