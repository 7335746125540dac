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

import importlib
from typing import Any

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


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'thrifty.runtime.training' has no attribute '{name}'")
    module = _EXPORTS[name]
    return getattr(importlib.import_module(module if "." in module else f"thrifty.runtime.training.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
