"""Bandit: HyperDrive's baseline from TuPAQ (5.3), extending the Default policy.

TuPAQ's action elimination, as HyperDrive implements it: the policy
tracks the global best performance and each job's best; at every evaluation
boundary b (every b epochs) a job continues if ``jobBest * (1 + eps) >
globalBest``, else it is terminated. eps = 0.5 and b = 10 epochs for
supervised learning. The rule assumes positive metrics (accuracy, or rewards
min-max normalized as in HyperDrive 6.3).
"""

from __future__ import annotations

import math

from thrifty.datasets.errors import ProblemError
from thrifty.runtime.tuning.base import Decision, check_positive
from thrifty.runtime.tuning.fifo import FIFO
from thrifty.runtime.tuning.trial import Report, Trial

__all__ = ["Bandit", "action_elimination_continues"]


def action_elimination_continues(job_best: float, global_best: float, epsilon: float) -> bool:
    """TuPAQ / HyperDrive 5.3: keep the job iff ``jobBest * (1 + eps) > globalBest``."""
    return job_best * (1.0 + epsilon) > global_best


class Bandit(FIFO):
    name = "bandit"

    def __init__(self, boundary: int = 10, epsilon: float = 0.5, atoms_per_trial: int = 1):
        super().__init__(atoms_per_trial)
        check_positive("boundary", boundary, integer=True)
        if not (math.isfinite(epsilon) and epsilon >= 0):
            raise ProblemError(f"`epsilon` is {epsilon!r}, but must be >= 0", path="epsilon")
        self.boundary = boundary
        self.epsilon = epsilon
        self._global_best = -math.inf
        self._job_best: dict[int, float] = {}

    def on_result(self, trial: Trial, report: Report) -> Decision:
        tid = trial.trial_id
        best = max(self._job_best.get(tid, -math.inf), report.metric)
        self._job_best[tid] = best
        self._global_best = max(self._global_best, best)
        if report.iteration % self.boundary:
            return Decision.CONTINUE
        if action_elimination_continues(best, self._global_best, self.epsilon):
            return Decision.CONTINUE
        return Decision.STOP
