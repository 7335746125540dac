"""EarlyTerm: HyperDrive's baseline from Domhan et al. (5.3), extending the Default policy.

Domhan et al.'s predictive termination criterion, parallel version: at every
evaluation boundary (b = 30 in [11]) it predicts
``pval = P(y_m >= y_hat | y_1..n)`` with m the maximum epoch and y_hat the best
performance seen, and terminates the job if pval < delta = 0.05. Here y_hat is
the best reported by any *other* trial: a trial that holds the global best is
not compared with itself (Domhan compares a run with the best of the others;
an interpretation, the paper does not say). The predictor is injected
(`forecasting`), the real one by default; `metric_range` as in `POP`.
"""

from __future__ import annotations

import math

from thrifty.core.errors import ProblemError
from thrifty.runtime.tuning.schedulers.base import Decision, check_positive
from thrifty.runtime.tuning.schedulers.fifo import FIFO
from thrifty.runtime.tuning.schedulers.forecasting import (DEFAULT_RANGE, Forecaster, MetricRange, check_in_range,
                                                           check_metric_range, default_forecaster, range_keywords)
from thrifty.runtime.tuning.trial import Report, Trial

__all__ = ["EarlyTerm"]


class EarlyTerm(FIFO):
    name = "earlyterm"

    def __init__(self, boundary: int = 30, delta: float = 0.05, atoms_per_trial: int = 1,
                 forecaster: Forecaster | None = None, metric_range: MetricRange = DEFAULT_RANGE):
        super().__init__(atoms_per_trial)
        check_positive("boundary", boundary, integer=True)
        if not 0 < delta < 1:
            raise ProblemError(f"`delta` is {delta!r}, but must be in (0, 1)", path="delta")
        self.boundary = boundary
        self.delta = delta
        self.metric_range = check_metric_range(metric_range)
        self.forecaster = forecaster if forecaster is not None else default_forecaster()
        self._best: list[tuple[float, int]] = []   # the two best (metric, trial id), distinct trials

    def _best_of_others(self, trial_id: int) -> float:
        for metric, tid in self._best:
            if tid != trial_id:
                return metric
        return -math.inf

    def _update_best(self, trial_id: int, metric: float) -> None:
        entries = {tid: m for m, tid in self._best}
        entries[trial_id] = max(entries.get(trial_id, -math.inf), metric)
        self._best = sorted(((m, tid) for tid, m in entries.items()), reverse=True)[:2]

    def on_result(self, trial: Trial, report: Report) -> Decision:
        check_in_range(trial, [report.metric], self.metric_range, "EarlyTerm", report.iteration)
        self._update_best(trial.trial_id, report.metric)
        if report.iteration % self.boundary:
            return Decision.CONTINUE
        y_hat = self._best_of_others(trial.trial_id)
        if y_hat == -math.inf:
            return Decision.CONTINUE
        max_epoch = self.experiment.max_iterations
        fc = self.forecaster(list(range(1, trial.iteration + 1)), list(trial.metrics), max_epoch, seed=0,
                             **range_keywords(self.metric_range))
        return Decision.STOP if fc.prob_at_least(y_hat, max_epoch) < self.delta else Decision.CONTINUE
