"""Training runtime (issue 5): run a training plan with heterogeneous batches,
watch its progress, re-plan on preemption or slowdown (Srifty 4.5, 5.4).

::

    from thrifty.runtime.training import train, RunConfig, Hooks

    result = train("plan.json", "mypkg.jobs:trainer", problem="problem.json")

The names below load on first use (PEP 562), so importing the package does
not pay for the solver, and nothing here imports torch until a run starts.
(Workers run the DDP kit's entry, `thrifty.runtime.ddp.worker`.)
"""

from __future__ import annotations

from thrifty.core.optional import lazy_exports

_EXPORTS = {
    "train": "driver", "RunConfig": "config", "RunResult": "records", "SegmentRecord": "records",
    "ProgressSnapshot": "records",
    "Trainer": "thrifty.runtime.ddp.trainer", "load_trainer": "thrifty.runtime.ddp.trainer",
    "Hooks": "hooks", "HOOK_EVENTS": "hooks",
    "KillWorker": "faults", "SlowWorker": "faults", "DelayStart": "faults",
    "ProgressMonitor": "monitor", "ThroughputWindow": "monitor", "Verdict": "monitor",
    "Replan": "replan", "Replanner": "replan",
    "RunLog": "runlog", "read_run_log": "runlog",
    "TrainingError": "errors", "WorldFormationError": "errors", "WorkerFailed": "errors",
    "StallError": "errors", "ReplanInfeasible": "errors", "RunInterrupted": "errors",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports("thrifty.runtime.training", _EXPORTS)
