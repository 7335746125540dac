"""Errors of the training runtime, under thrifty's one error root.

Every wait in the runtime has a timeout, and each timeout ends in one of these
with a message that says what was waited for, how long, and where the logs
are; the last good checkpoint is never touched by a failure.
"""

from __future__ import annotations

from thrifty.core.errors import ThriftyError

__all__ = ["TrainingError", "WorldFormationError", "WorkerFailed", "StallError", "ReplanInfeasible",
           "RunInterrupted", "Terminated", "RunFinished"]


class TrainingError(ThriftyError, RuntimeError):
    """A training run could not go on. `train` sets `run_dir` (where the run
    lives) and `checkpoint_iteration` (where its last checkpoint is, from
    which ``train(resume=run_dir)`` goes on) on the way out."""

    run_dir: object = None
    checkpoint_iteration: int | None = None


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


class RunInterrupted(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C) and stopped: the workers were asked to
    checkpoint and stop (killed when that took longer than
    ``RunConfig.stop_timeout_s`` or a second Ctrl-C came). A
    `KeyboardInterrupt`, so code that handles Ctrl-C handles this too.

    `iteration` is the last iteration the run reached, `checkpoint_iteration`
    where its last checkpoint is (``train(resume=run_dir)`` goes on from there).
    """

    def __init__(self, signal: str = "SIGINT", iteration: int | None = None,
                 checkpoint_iteration: int | None = None, run_dir: object = None):
        where = "" if iteration is None else f" at iteration {iteration} (checkpoint at {checkpoint_iteration})"
        super().__init__(f"interrupted by {signal}{where}")
        self.signal, self.iteration = signal, iteration
        self.checkpoint_iteration, self.run_dir = checkpoint_iteration, run_dir


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised by ``thrifty run``'s handler so that a run stops as on
    Ctrl-C (the workers checkpoint and stop); the run ends in a
    `RunInterrupted` whose signal is ``SIGTERM``."""


class RunFinished(ThriftyError):
    """The run asked to resume has already finished: there is nothing to run,
    and nothing was run or logged. `finish` is its run log's ``finish`` event
    (iterations, elapsed_s, cost_usd, within_limits, ...)."""

    def __init__(self, run_dir: object, finish: dict):
        limits = "within its limits" if finish.get("within_limits") else "OUTSIDE its limits"
        seconds, usd = float(finish.get("elapsed_s") or 0.0), float(finish.get("cost_usd") or 0.0)
        super().__init__(f"{run_dir} has finished: {finish.get('iterations')} iterations in {seconds:,.1f} s "
                         f"for ${usd:,.4f}, {limits}; nothing to resume")
        self.run_dir, self.finish = run_dir, finish
