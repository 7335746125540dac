"""thrifty.datasets: shipped data (instance catalog, compute and scaling
profiles, allreduce probes, learning-curve traces, example problems) and the
loaders that find it. The names below import lazily: importing
``thrifty.datasets.paths`` does not build the catalog's schema. The error
root, io and validation are in `thrifty.core`."""

from __future__ import annotations

from thrifty.core.optional import lazy_exports

_EXPORTS = {
    "Catalog": "catalog", "CatalogFile": "catalog", "InstanceType": "catalog", "load_catalog": "catalog",
    "DATA_DIR": "paths", "profile_files": "paths", "allreduce_files": "paths",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("thrifty.datasets", _EXPORTS)
