"""thrifty.perfmodels: the pure performance models (numpy and scipy only).

Compute latency (`ComputeModel`, from measured profiles), bus bandwidth and
allreduce (`AnalyticAllreduce`, the learned `LearnedAllreduce`, the derived
cloud model `DerivedCloudAllreduce`), the event-queue
iteration simulator (`IterationSimulator`, Srifty 4.3) and its alpha-beta
baseline (`ApmSimulator`), the tuning job simulator (`JobSimulator`,
RubberBand 4.2), learning-curve forecasts (`forecast`, HyperDrive 4.3) and the
scaling and cloud profiles of tuning jobs. The names below import lazily:
``import thrifty.perfmodels`` costs nothing until one is used.

Measurement with torch (the profiler, the scaling profiler, the allreduce
probe, the model zoo) and the worker worlds they and the runtime share live
in `thrifty.runtime.measure`; nothing outside it imports torch.
"""

from __future__ import annotations

from thrifty.core.optional import lazy_exports

_EXPORTS = {
    "ComputeModel": "compute", "PiecewiseLinear": "compute", "load_compute_model": "compute",
    "BandwidthModel": "bandwidth", "AnalyticAllreduce": "bandwidth", "allreduce_time": "bandwidth",
    "bus_bandwidth_from_time": "bandwidth",
    "LearnedAllreduce": "allreduce", "load_allreduce_model": "allreduce",
    "load_bandwidth_model": "loading", "default_bandwidth_model": "loading", "cloud_bandwidth_model": "loading",
    "DerivedCloudAllreduce": "allreduce.derived", "load_cloud_allreduce_model": "allreduce.derived",
    "IterationSimulator": "simulator", "IterationPrediction": "simulator",
    "ApmSimulator": "apm", "AlphaBetaAllreduce": "apm",
    "JobSimulator": "jobsim", "JobResult": "jobsim", "StageAllocation": "jobsim",
    "ExperimentSpec": "experiment", "sha_spec": "experiment", "hyperband_spec": "experiment",
    "ScalingProfile": "scaling", "CloudProfile": "scaling", "load_scaling_profile": "scaling",
    "CurvePrior": "learning_curve", "CurveForecast": "learning_curve", "forecast": "learning_curve",
    "MachineGroup": "cluster", "parse_cluster": "cluster",
    "ModelLibrary": "library", "shipped_library": "library",
    "ComputeProfile": "profile", "load_profile": "profile", "save_profile": "profile",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("thrifty.perfmodels", _EXPORTS)
