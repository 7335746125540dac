"""How a training run behaves (`RunConfig`): checkpoints, the monitor's
window, timeouts, the solver on a re-plan. ``thrifty run``'s options and a
run record's ``config`` are its fields, and where its metrics go besides
``metrics.jsonl`` (`metrics`: ``tensorboard``, ``mlflow``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from thrifty.core.errors import ProblemError
from thrifty.runtime.metrics import parse_kinds
from thrifty.runtime.training.monitor import auto_window_s
from thrifty.solver.plan import Plan
from thrifty.solver.problem import TrainingProblem

__all__ = ["RunConfig"]


@dataclass(frozen=True)
class RunConfig:
    """How a run behaves. Times in seconds.

    `window_s` is Srifty's K and `window_bins` the bins its throughput
    standard deviation is taken over; None (the default) scales the window
    with the job (`monitor.auto_window_s`: a tenth of the time limit or of
    the predicted time, at most Srifty's 5 minutes), so that a short job
    shows its rate and re-plans on a persistent slowdown too. `replan_time_limit_s` is the
    solver's time limit on a re-plan (Srifty gives itself 1 s). `weighting`:
    ``batch`` (gradient reweighting by loss scaling, the default), ``hook``
    (the same as a DDP communication hook) or ``mean`` (plain DDP averaging,
    equal batches only); see `thrifty.runtime.ddp.reweight`.
    """

    checkpoint_every: int | None = 100
    checkpoint_every_s: float | None = 60.0
    checkpoint: str | None = None  # a path or s3://bucket/key every machine reaches; None: RUN_DIR/checkpoint.pt
    window_s: float | None = None
    window_bins: int = 10
    replan_on_slowdown: bool = True
    poll_s: float = 0.05
    world_timeout_s: float = 120.0
    stall_timeout_s: float = 600.0
    stop_timeout_s: float = 120.0
    collective_timeout_s: float = 600.0
    provision_timeout_s: float = 600.0
    threads: int = 1
    seed: int = 0
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    weighting: Literal["batch", "hook", "mean"] = "batch"
    solver_method: str = "auto"
    replan_time_limit_s: float | None = 1.0
    max_replans: int = 16
    log_every_s: float | None = None  # throughput log period; default window_s / window_bins
    metrics: tuple[str, ...] = ()  # the optional metrics sinks (`thrifty.runtime.metrics`); metrics.jsonl always

    def __post_init__(self) -> None:
        object.__setattr__(self, "metrics", parse_kinds(self.metrics))  # a run record's list, or names
        if self.window_s is not None and not self.window_s > 0:
            raise ProblemError(f"is {self.window_s}, but must be positive (or None: automatic)", path="window_s")
        for name in ("poll_s", "world_timeout_s", "stall_timeout_s", "stop_timeout_s",
                     "collective_timeout_s", "provision_timeout_s"):
            if not getattr(self, name) > 0:
                raise ProblemError(f"is {getattr(self, name)}, but must be positive", path=name)
        if self.window_bins < 2:
            raise ProblemError(f"is {self.window_bins}, but must be at least 2", path="window_bins")
        if self.threads < 1:
            raise ProblemError(f"is {self.threads}, but must be at least 1", path="threads")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise ProblemError(f"is {self.checkpoint_every}, but must be at least 1", path="checkpoint_every")

    def window_for(self, plan: Plan, problem: TrainingProblem) -> float:
        """The monitor's window for `plan` of `problem`: `window_s`, or automatic."""
        if self.window_s is not None:
            return self.window_s
        p = plan.predicted
        return auto_window_s(problem.limits.time_s, p.total_s if p else None, p.iteration_s if p else None,
                             self.window_bins)
