"""thrifty.core: what every layer shares and nothing else owns: the error
root (`errors`), atomic writes and document loading (`io`), validation of
JSON-shaped input against pydantic models with JSON-path errors
(`validation`), and the one way to import an optional dependency
(`optional`). It is the bottom layer: it imports nothing of thrifty's, and
``datasets <- perfmodels <- solver <- runtime`` all import it."""

from __future__ import annotations

from thrifty.core.optional import lazy_exports

_EXPORTS = {
    "ThriftyError": "errors", "ProblemError": "errors", "SolverError": "errors", "ProviderError": "errors",
    "MissingDependencyError": "errors", "require": "optional",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("thrifty.core", _EXPORTS)
