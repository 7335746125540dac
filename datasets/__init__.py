"""thrifty.datasets: shipped data (instance catalog, compute and scaling
profiles, allreduce probes, learning-curve traces, example problems) and the
loaders that find it; the error root every layer raises."""

from thrifty.datasets.catalog import Catalog, CatalogFile, InstanceType, load_catalog
from thrifty.datasets.errors import (
    MissingDependencyError,
    ProblemError,
    ProviderError,
    SolverError,
    ThriftyError,
)
from thrifty.datasets.paths import DATA_DIR, profile_files, allreduce_files

__all__ = [
    "Catalog",
    "CatalogFile",
    "InstanceType",
    "load_catalog",
    "ThriftyError",
    "ProblemError",
    "SolverError",
    "ProviderError",
    "MissingDependencyError",
    "DATA_DIR",
    "profile_files",
    "allreduce_files",
]
