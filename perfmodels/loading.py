"""Load the bandwidth model a command or the solver should use.

The default is the learned model shipped for this host's ``local`` type
(measured gloo probes), which itself falls back to the analytic ring model
for every type it has no probes for, and says so in ``source(itype)``.
"""

from __future__ import annotations

from pathlib import Path

from thrifty.datasets.paths import DATA_DIR
from thrifty.perfmodels.bandwidth import AnalyticAllreduce, BandwidthModel

__all__ = ["SHIPPED_LOCAL_MODEL", "default_bandwidth_model", "load_bandwidth_model"]

SHIPPED_LOCAL_MODEL = DATA_DIR / "allreduce" / "local-gloo-model.json"


def load_bandwidth_model(path: str | Path) -> BandwidthModel:
    """A learned allreduce model file (``thrifty fit-allreduce``)."""
    from thrifty.perfmodels.allreduce import load_allreduce_model

    return load_allreduce_model(path)


def default_bandwidth_model() -> BandwidthModel:
    if SHIPPED_LOCAL_MODEL.exists():
        return load_bandwidth_model(SHIPPED_LOCAL_MODEL)
    return AnalyticAllreduce()
