"""thrifty.datasets: shipped data (instance catalog, compute and scaling
profiles, allreduce probes, learning-curve traces, example problems) and the
loaders that find it; the error root every layer raises. The names below
import lazily: importing ``thrifty.datasets.errors`` (as every command does)
does not build the catalog's schema."""

from __future__ import annotations

from thrifty.datasets.optional import lazy_exports

_EXPORTS = {
    "Catalog": "catalog", "CatalogFile": "catalog", "InstanceType": "catalog", "load_catalog": "catalog",
    "ThriftyError": "errors", "ProblemError": "errors", "SolverError": "errors", "ProviderError": "errors",
    "MissingDependencyError": "errors",
    "DATA_DIR": "paths", "profile_files": "paths", "allreduce_files": "paths",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("thrifty.datasets", _EXPORTS)
