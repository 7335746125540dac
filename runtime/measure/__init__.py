"""thrifty.runtime.measure: measuring with torch on this host.

- `profiler` (``thrifty profile``): a compute profile (Srifty 4.1), in
  phases: `workloads`, `timing`, `memory`, `colocated`, `progress`;
- `job_profile` (``thrifty profile JOB``): what the command names, resolved
  once (a job or a workload), and a job's profile from its own loop;
- `scaling_profiler` (``thrifty profile-scaling``): a scaling profile
  (RubberBand 4.1);
- `probe` (``thrifty probe-allreduce``): the allreduce grid probe (Srifty 4.2);
- `truth` (``thrifty validate``): real DDP iterations of a workload, timed
  as a user's own loop runs them, to check predictions against;
- `job_truth` (``thrifty validate JOB``, ``thrifty profile-scaling JOB``):
  a job's own loop timed in the rank loop of ``thrifty run``;
- `remote` (``--cluster`` of ``profile``): what runs on a cluster's machines;
- `zoo`: reference workloads;
- `worlds`: the one way thrifty starts worker processes, and the utilities
  the runtime shares with measurement (the only part the runtime's training
  and tuning code imports; its CLI commands call the tools' entry points
  named below).

The names below import lazily; torch is imported when a tool runs.
"""

from __future__ import annotations

from thrifty.core.optional import lazy_exports

_EXPORTS = {
    "profile_workload": "profiler", "load_workload": "profiler",
    "resolve_device": "profiler", "device_label": "profiler",
    "geometric_batches": "profiler", "DEFAULT_CPU_MAX_BATCH": "profiler",
    "resolve_target": "job_profile", "profile_job": "job_profile",
    "profile_scaling": "scaling_profiler", "check_world_sizes": "scaling_profiler",
    "default_model_name": "scaling_profiler",
    "probe_allreduce": "probe", "write_probe_csv": "probe", "ProbeConfig": "probe", "ProbeTarget": "probe",
    "ProbeFailed": "probe", "PROBE_PRELOAD": "probe", "Placement": "probe",
    "wait_ready": "remote", "profile_on": "remote", "REMOTE_PRELOAD": "remote",
    "FACTORIES": "zoo", "Workload": "zoo",
    "measure_rounds": "truth", "summarize": "truth", "check_ranks": "truth", "Truth": "truth",
    "TruthRun": "truth",
    "measure_job_rounds": "job_truth", "first_timed": "job_truth",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports("thrifty.runtime.measure", _EXPORTS)
