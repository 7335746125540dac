"""Bandit: HyperDrive's baseline from TuPAQ (5.3), extending the Default policy.

TuPAQ's action elimination, as HyperDrive implements it: the policy
tracks the global best performance and each job's best; at every evaluation
boundary b (every b epochs) a job continues if ``jobBest * (1 + eps) >
globalBest``, else it is terminated. eps = 0.5 and b = 10 for supervised
learning.

The paper's rule compares performances on a scale whose zero is the worst
one: accuracies, or rewards min-max normalised (HyperDrive 6.3, Eq. 4:
``r_norm = (r - r_min) / (r_max - r_min)``). Read on raw scores it breaks
for any sign: with a negative best (a loss under ``mode: min``, whose score
is ``-loss``, or a reward below 0) ``jobBest * 1.5 > globalBest`` is false
for the best job itself, and every job is killed. So the rule is applied
on that normalised scale, where the scale ``r_max - r_min`` cancels and only
the zero matters: a job continues iff ``(jobBest - r_min) * (1 + eps) >
globalBest - r_min``, with ``r_min`` the lower side of the metric's range as
the schedulers see it (`lower`: 0 for an accuracy, the paper's case, where
the rule is the paper's verbatim) or, where the range has no lower side or
a score fell below it, the lowest score seen so far (HyperDrive's r_min is
the lowest reward; this is the lowest observed). The job holding the global
best always continues (with r_min equal to every score, ``0 > 0`` would
stop it).
"""

from __future__ import annotations

import math

from thrifty.core.errors import ProblemError
from thrifty.runtime.tuning.schedulers.base import Decision, check_positive
from thrifty.runtime.tuning.schedulers.fifo import FIFO
from thrifty.runtime.tuning.trial import Report, Trial

__all__ = ["Bandit", "action_elimination_continues"]


def action_elimination_continues(job_best: float, global_best: float, epsilon: float, r_min: float = 0.0) -> bool:
    """TuPAQ / HyperDrive 5.3 on the normalised scale whose zero is `r_min`:
    keep the job iff ``(jobBest - r_min) * (1 + eps) > globalBest - r_min``, or it holds the global best."""
    return job_best >= global_best or (job_best - r_min) * (1.0 + epsilon) > global_best - r_min


class Bandit(FIFO):
    name = "bandit"

    def __init__(self, boundary: int = 10, epsilon: float = 0.5, atoms_per_trial: int = 1,
                 lower: float | None = 0.0):
        super().__init__(atoms_per_trial)
        check_positive("boundary", boundary, integer=True)
        if not (math.isfinite(epsilon) and epsilon >= 0):
            raise ProblemError(f"`epsilon` is {epsilon!r}, but must be >= 0", path="epsilon")
        if lower is not None and not math.isfinite(lower):
            raise ProblemError(f"`lower` is {lower!r}, but must be a finite number or None", path="lower")
        self.boundary = boundary
        self.epsilon = epsilon
        self.lower = lower
        self._global_best = -math.inf
        self._lowest = math.inf
        self._job_best: dict[int, float] = {}

    def r_min(self) -> float:
        """The zero of the normalised scale: `lower`, or the lowest score seen when lower (or no `lower`)."""
        return self._lowest if self.lower is None else min(self.lower, self._lowest)

    def on_result(self, trial: Trial, report: Report) -> Decision:
        tid = trial.trial_id
        best = max(self._job_best.get(tid, -math.inf), report.metric)
        self._job_best[tid] = best
        self._global_best = max(self._global_best, best)
        self._lowest = min(self._lowest, report.metric)
        if report.iteration % self.boundary:
            return Decision.CONTINUE
        if action_elimination_continues(best, self._global_best, self.epsilon, self.r_min()):
            return Decision.CONTINUE
        return Decision.STOP
