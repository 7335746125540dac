"""Builders shared by tests: small profiles, instance types and a fixed-bandwidth model
whose answers are easy to compute by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from thrifty.datasets.catalog import InstanceType
from thrifty.perfmodels.compute import ComputeModel
from thrifty.perfmodels.profile import ComputeProfile


def instance(name: str = "t.1", gpus: int = 1, device: str = "dev", network_gbps: float = 10.0,
             on_demand: float = 1.0, spot: float | None = 0.3) -> InstanceType:
    return InstanceType(name=name, gpus=gpus, device=device, gpu_memory_gib=16, vcpus=8, memory_gib=32,
                        network_gbps=network_gbps, on_demand_usd_per_hour=on_demand, spot_usd_per_hour=spot)


def profile_dict(model: str = "m", device: str = "dev", fw=(0.01, 0.001), bw=(0.02, 0.002),
                 cv: float = 0.0, layers=((1000, 0.5), (1000, 1.0)), max_batch: int = 256,
                 step_s: float = 0.0, batches=(1, 2, 4, 8, 16, 32, 64, 128, 256)) -> dict:
    """A profile whose forward/backward are exactly linear: t = intercept + slope * B."""
    points = []
    for b in batches:
        f = fw[0] + fw[1] * b
        w = bw[0] + bw[1] * b
        points.append({"batch": b, "forward_s": f, "backward_s": w, "forward_sd_s": cv * f,
                       "backward_sd_s": cv * w, "repeats": 10})
    return {
        "format": "thrifty.compute_profile/1", "model": model, "device": device,
        "provenance": {"kind": "derived", "script": "tests/helpers.py", "inputs": "synthetic"},
        "max_batch": max_batch, "step_s": step_s, "points": points,
        "layers": [{"name": f"l{i}", "grad_bytes": g, "ready_frac": r} for i, (g, r) in enumerate(layers)],
    }


def compute_model(**kw) -> ComputeModel:
    return ComputeModel.from_profile(ComputeProfile.model_validate(profile_dict(**kw)))


class FixedBandwidth:
    """Bus bandwidth `bus` bytes/s for every buffer, total cap `cap`."""

    def __init__(self, bus: float, cap: float):
        self.bus, self.cap = bus, cap

    def bus_bandwidth(self, itype, sizes, world_size, instances):
        return np.full(len(sizes), self.bus, dtype=float)

    def bandwidth_cap(self, itype, world_size, instances):
        return self.cap

    def source(self, itype):
        return "fixed"

    def provenance_of(self, itype):
        from thrifty.perfmodels.provenance import FigureSource

        return FigureSource(kind="analytic", model="fixed bus bandwidth",
                            note=f"{self.bus:g} B/s, cap {self.cap:g} B/s")


def load_script(path: str | Path) -> ModuleType:
    """Import a script of `datasets/scripts/` as a module (registered in
    `sys.modules` while it runs: dataclasses look their module up)."""
    name = "thrifty_script_" + Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


# The first lines of a script a test runs as a terminal's foreground command and then stops with Ctrl-C: SIGINT
# raises KeyboardInterrupt there. A process started with SIGINT ignored (a harness's background job) keeps ignoring
# it, as Python and thrifty do, and a test run from such a harness would send its Ctrl-C in vain.
TERMINAL = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
# the `thrifty` command line as a script's last lines, and so started
CLI = "import sys\nfrom thrifty.runtime.cli import main\nsys.exit(main(sys.argv[1:]))\n"
TERMINAL_CLI = TERMINAL + CLI
