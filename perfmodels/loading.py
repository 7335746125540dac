"""Load the bandwidth model a command or the solver should use.

The default is a chain, each model answering the types it has a basis for
and passing the others on, and saying in ``source(itype)`` which answered:

1. the learned model shipped for this host's ``local`` type (measured gloo
   probes): ``"learned"``;
2. the derived cloud model of GPU instance types (published measurements and
   AWS/NVIDIA documentation, `thrifty.perfmodels.allreduce.derived`):
   ``"derived"``;
3. the analytic ring model for everything else: ``"analytic"``.

A model file a problem names (``"allreduce": "model.json"``, measured with
``thrifty probe-allreduce`` and fitted with ``thrifty fit-allreduce``) takes
the place of 1 and falls back to 2 and 3.
"""

from __future__ import annotations

from pathlib import Path

from thrifty.datasets.paths import DATA_DIR
from thrifty.perfmodels.bandwidth import AnalyticAllreduce, BandwidthModel

__all__ = ["SHIPPED_LOCAL_MODEL", "SHIPPED_CLOUD_MODEL", "default_bandwidth_model", "load_bandwidth_model",
           "cloud_bandwidth_model"]

SHIPPED_LOCAL_MODEL = DATA_DIR / "allreduce" / "local-gloo-model.json"
SHIPPED_CLOUD_MODEL = DATA_DIR / "allreduce" / "cloud-derived-model.json"


def cloud_bandwidth_model() -> BandwidthModel:
    """The shipped derived cloud model, falling back to the analytic ring."""
    if not SHIPPED_CLOUD_MODEL.exists():
        return AnalyticAllreduce()
    from thrifty.perfmodels.allreduce.derived import load_cloud_allreduce_model

    return load_cloud_allreduce_model(SHIPPED_CLOUD_MODEL, fallback=AnalyticAllreduce())


def load_bandwidth_model(path: str | Path, fallback: BandwidthModel | None = None,
                         named: bool = True) -> BandwidthModel:
    """A learned allreduce model file (``thrifty fit-allreduce``); types it has
    no probes for go to `fallback` (default: `cloud_bandwidth_model`). A file
    a problem or a command `named` reports each type it lacks as a fallback
    (``provenance_of``); the shipped model of this host's ``local`` type does not."""
    from thrifty.perfmodels.allreduce import load_allreduce_model

    model = load_allreduce_model(path, fallback=fallback if fallback is not None else cloud_bandwidth_model())
    model.named = named
    return model


def default_bandwidth_model() -> BandwidthModel:
    cloud = cloud_bandwidth_model()
    if SHIPPED_LOCAL_MODEL.exists():
        return load_bandwidth_model(SHIPPED_LOCAL_MODEL, fallback=cloud, named=False)
    return cloud
