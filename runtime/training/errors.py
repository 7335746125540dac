"""Errors of the training runtime, under thrifty's one error root.

Every wait in the runtime has a timeout, and each timeout ends in one of these
with a message that says what was waited for, how long, and where the logs
are; the last good checkpoint is never touched by a failure.
"""

from __future__ import annotations

from thrifty.datasets.errors import ThriftyError

__all__ = ["TrainingError", "WorldFormationError", "WorkerFailed", "StallError", "ReplanInfeasible"]


class TrainingError(ThriftyError, RuntimeError):
    """A training run could not go on."""


class WorldFormationError(TrainingError):
    """The workers did not all join the process group in time."""


class WorkerFailed(TrainingError):
    """A worker raised (its traceback is in the run log and its log file)."""

    def __init__(self, message: str, rank: int | None = None, details: str = ""):
        super().__init__(message)
        self.rank = rank
        self.details = details


class StallError(TrainingError):
    """The workers made no progress for longer than the stall timeout."""


class ReplanInfeasible(TrainingError):
    """No plan meets what is left of the limits after a preemption; the run
    stops with its last checkpoint, which a later run can resume from."""

    def __init__(self, message: str, plan: object = None):
        super().__init__(message)
        self.plan = plan
