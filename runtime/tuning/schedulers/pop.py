"""POP: promising / opportunistic / poor scheduling (HyperDrive, Middleware 2017, 3 and 5.3).

User inputs (3.1.1, 5.3): the maximum experiment time T_max, the target
performance y_target, the evaluation boundary b (epochs; 5-10% of the maximum
epoch, 9), a kill threshold (domain knowledge: a little above random accuracy),
and the termination bound (p < 0.05).

At every evaluation boundary of a job i (every b epochs), OnIterationFinish:

1. *Poor, by domain knowledge*: if its performance is below the kill threshold,
   terminate it.
2. *Expected remaining time and confidence* (3.1.1): with ``Epoch_i`` its mean
   measured epoch time and ``M_i = (T_max - T_pass) / Epoch_i`` the epochs it
   could still run (and at most R - n, the epochs it has left), the
   learning-curve model gives ``P(y(n + m) >= y_target | y(1..n))``;
   ``p_m = P(.. n + m ..) - P(.. n + m - 1 ..)`` (p_1 = the first term),
   ``x_i = sum_m m p_m``, ``ERT_i = x_i Epoch_i``, and the confidence
   ``p = sum_m p_m``, summing until ERT passes ``T_max - T_pass`` (then ERT is
   set to ``T_max - T_pass``).
3. *Poor, by prediction*: if p < 0.05, terminate it.
4. *Infused classification and scheduling* (3.2): over all active jobs' latest
   confidences, ``N_satisfying(p)`` = jobs with confidence >= p,
   ``S_desired(p) = N_satisfying(p) k``, ``S_deserved(p) = S p``,
   ``S_effective(p) = min(desired, deserved)``; the promising pool gets
   ``S_promising = max_p S_effective(p)`` slots (floored to whole slots), taken
   by the jobs of highest confidence among those with confidence >= the
   maximizing p* (``floor(S_promising / k)`` of them). They are labelled with
   priority p and keep running; an opportunistic job is suspended so that the
   opportunistic slots are shared round-robin (5.3: "if the job is opportunistic
   we suspend it and start a new job").

Idle jobs are started in HyperDrive's job-manager order (4.2) with
``resume="fifo"``: labelled (promising) jobs by priority, then FIFO —
configurations not yet started (the generator's jobs, created at the
beginning) before suspended opportunistic jobs, which queue in the order they
were suspended.

``resume="confidence"`` (the default; a deviation, thrifty's): after the
promising jobs, the suspended job of highest confidence resumes before a new
configuration starts when its confidence is above what a new configuration
can expect: the mean confidence of the trials at their first evaluation
boundary so far (a trial killed there by the kill threshold counts as 0), which
for a calibrated forecaster is the chance that a configuration drawn from
the search space reaches the target; before any trial was evaluated, new
configurations first. Why: under FIFO a suspended job that is likely to reach
the target (at epoch 4, digits-mlp's winners had a median confidence of 0.18,
up to 0.55, against a mean of 0.08 over all configurations) waits behind
every configuration not yet started. Measured (benchmarks/schedulers.py, digits-mlp at 0.983, 25 orders):
POP with oracle confidences only for the promising classification matched
POP with oracle curves (1.75x Bandit), while oracle kills alone gave 1.29x,
so the forecaster's confidence was lost in the job order, not in the kills.
The rule was chosen on digits-mlp and is reported on noisy-digits-cnn too.
A driver restarted with ``--resume`` rebuilds the first-boundary confidences
and the suspended jobs' confidences by replaying the record, each result
forecast from the curve as it stood then, with the time that was left then
(the loop's replay; see `thrifty.runtime.tuning.loop`).

Deviations, stated: HyperDrive reads ``P(y(n + m) >= y_target)`` as the
probability of having reached the target by epoch n + m, which holds for a
curve that only rises. An observed validation metric is noisy, and a trial
reaches the target at its first epoch at or above it; so when the forecast
offers it, the cumulative probabilities are those of that first passage
(`CurveForecast.prob_reached_by`): on a noisy plateau just below the target
each epoch's chance is small but the chance of some epoch reaching it is not,
and Eq. 2's single-epoch reading ranked such trials as poor. Forecasts with
only ``prob_at_least`` are read as the paper does, made non-decreasing in m
(a running maximum) so that every p_m >= 0 (the model may predict a dip);
other jobs' confidences are those computed at their own last
boundary, as in 5.3 ("the tail distribution across all currently active
job's p values"). The predictor is injected (`forecasting`), the project's own
(perfmodels.learning_curve) by default.

`metric_range` (default ``[0, 1]``, accuracy) is the range of the metric as
POP sees it (higher is better), which the forecaster fits within; a value
reported outside it is bad input (a ProblemError naming ``metric_range``),
checked at every result so that a run stops at the first one (a result below
the kill threshold is not: that trial is killed, never forecast) and before
every forecast.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from thrifty.core.errors import ProblemError
from thrifty.runtime.tuning.schedulers.base import Decision, Scheduler, Start, check_atoms_per_trial, check_positive
from thrifty.runtime.tuning.schedulers.forecasting import (DEFAULT_RANGE, Forecaster, MetricRange, check_in_range,
                                                           check_metric_range, default_forecaster, forecast_trial,
                                                           in_range, shown_range)
from thrifty.runtime.tuning.trial import Report, Trial, TrialState

__all__ = ["POP", "confidence_and_ert", "promising_slots", "RESUME_ORDERS"]

RESUME_ORDERS = ("confidence", "fifo")


def confidence_and_ert(reach_prob: Sequence[float], epoch_s: float, time_left: float) -> tuple[float, float]:
    """HyperDrive 3.1.1, Eq. 2-3: confidence p and expected remaining time ERT.

    `reach_prob[m - 1]` is ``P(y(n + m) >= y_target)`` for the next m = 1..M
    epochs. Summation stops once ERT would pass `time_left` (T_max - T_pass),
    and ERT is then `time_left`.
    """
    p = 0.0
    x = 0.0
    previous = 0.0
    for m, prob in enumerate(reach_prob, start=1):
        cumulative = max(previous, min(1.0, prob))
        p_m = cumulative - previous
        previous = cumulative
        if (x + m * p_m) * epoch_s > time_left:
            return p, time_left
        x += m * p_m
        p += p_m
    return p, x * epoch_s


def promising_slots(confidences: Sequence[float], slots: int, slots_per_job: int = 1) -> tuple[int, float]:
    """HyperDrive 3.2: (S_promising, p*) = max over p of min(N_satisfying(p) k, S p).

    The maximum sits at one of the jobs' own confidences (S_desired steps down
    there, S_deserved grows with p); among equal S_effective the higher p wins.
    Returns (0, inf) when the pool is smaller than one slot.
    """
    best_slots, best_p = 0.0, math.inf
    ordered = sorted(confidences, reverse=True)
    for i, p in enumerate(ordered):
        if p <= 0:
            break
        if i + 1 < len(ordered) and ordered[i + 1] == p:
            continue  # N_satisfying(p) counts every job tied at p
        effective = min((i + 1) * slots_per_job, slots * p)
        if effective > best_slots:
            best_slots, best_p = effective, p
    pool = math.floor(best_slots + 1e-9)
    return (pool, best_p) if pool > 0 else (0, math.inf)


class POP(Scheduler):
    name = "pop"

    def __init__(self, target: float, *, max_time: float | None = None, boundary: int = 10,
                 kill_threshold: float | None = None, min_confidence: float = 0.05, atoms_per_trial: int = 1,
                 forecaster: Forecaster | None = None, learn_prior: bool = True,
                 metric_range: MetricRange = DEFAULT_RANGE, resume: str = "confidence"):
        super().__init__()
        if not isinstance(target, (int, float)) or not math.isfinite(target):
            raise ProblemError(f"`target` is {target!r}, but must be a finite number", path="target")
        if max_time is not None:
            check_positive("max_time", max_time)
        check_positive("boundary", boundary, integer=True)
        if not 0 <= min_confidence < 1:
            raise ProblemError(f"`min_confidence` is {min_confidence!r}, but must be in [0, 1)",
                               path="min_confidence")
        check_positive("atoms_per_trial", atoms_per_trial, integer=True)
        if resume not in RESUME_ORDERS:
            raise ProblemError(f"`resume` is {resume!r}, but must be one of {', '.join(RESUME_ORDERS)}",
                               path="resume")
        self.resume = resume
        self.first_confidences: list[float] = []   # every trial's confidence at its first boundary
        self._first_total = 0.0                     # their sum (choose reads the mean at every free slot)
        self.metric_range = check_metric_range(metric_range)
        if not in_range(target, self.metric_range):
            raise ProblemError(f"`target` is {target!r}, outside metric_range {shown_range(self.metric_range)}: "
                               "no trial could reach it", path="target")
        self.target = float(target)
        self._max_time = max_time
        self.boundary = boundary
        self.kill_threshold = kill_threshold
        self.min_confidence = min_confidence
        self.atoms_per_trial = atoms_per_trial
        self.forecaster = forecaster if forecaster is not None else default_forecaster()
        self.learn_prior = learn_prior
        self.confidence: dict[int, float] = {}      # active jobs' latest p
        self.ert_s: dict[int, float] = {}
        self.promising: dict[int, float] = {}       # promising jobs -> priority label p
        self.promising_pool = 0                     # S_promising
        self.killed: dict[int, str] = {}
        self._suspended: deque[int] = deque()
        self._started_at = 0.0
        self._t_max = math.inf

    def bind(self, experiment) -> None:
        super().bind(experiment)
        check_atoms_per_trial(self.atoms_per_trial, experiment.total_atoms)
        self._started_at = getattr(experiment, "started_at", None) or experiment.now()  # earlier, when resumed
        if self._max_time is not None:
            self._t_max = self._max_time
        elif experiment.deadline is not None:
            self._t_max = experiment.deadline - self._started_at
        else:
            raise ProblemError("POP needs the maximum experiment time T_max: give the experiment a deadline "
                               "or POP(max_time=...)", path="max_time")

    # --- AllocateJobs ------------------------------------------------------------------
    def choose(self) -> Start | None:
        exp = self.experiment
        if exp.free_atoms < self.atoms_per_trial:
            return None
        trials = exp.trials
        idle_promising = [tid for tid in self.promising if trials[tid].state == TrialState.PAUSED]
        if idle_promising:
            return Start(max(idle_promising, key=lambda tid: (self.promising[tid], -tid)), self.atoms_per_trial)
        if self.resume == "confidence":
            best = self._most_confident_suspended()
            if best is not None and (not exp.has_more_configs() or self.confidence[best] > self.fresh_confidence()):
                self._suspended.remove(best)
                return Start(best, self.atoms_per_trial)
        if exp.has_more_configs():
            return Start(None, self.atoms_per_trial)
        while self._suspended:
            tid = self._suspended.popleft()
            if trials[tid].state == TrialState.PAUSED:
                return Start(tid, self.atoms_per_trial)
        return None

    def fresh_confidence(self) -> float:
        """What a configuration not yet started can expect: the mean first-boundary confidence (1 before any)."""
        return self._first_total / len(self.first_confidences) if self.first_confidences else 1.0

    def _first_boundary(self, p: float) -> None:
        self.first_confidences.append(p)
        self._first_total += p

    def _most_confident_suspended(self) -> int | None:
        trials = self.experiment.trials
        waiting = [tid for tid in self._suspended if trials[tid].state == TrialState.PAUSED and tid in self.confidence]
        return max(waiting, key=lambda tid: (self.confidence[tid], -tid), default=None)

    def on_restored(self) -> None:
        """Suspended jobs: the paused trials, in the order they were suspended."""
        trials = self.experiment.trials
        paused = [tid for tid, t in trials.items() if t.state == TrialState.PAUSED]
        order = [tid for tid in dict.fromkeys(self._suspended) if tid in set(paused)]
        self._suspended = deque(order + [tid for tid in paused if tid not in set(order)])

    # --- OnIterationFinish -------------------------------------------------------------
    def on_result(self, trial: Trial, report: Report) -> Decision:
        n = report.iteration
        tid = trial.trial_id
        max_epoch = self.experiment.max_iterations
        if self.kill_threshold is None or report.metric >= self.kill_threshold:  # below it: killed, not forecast
            check_in_range(trial, [report.metric], self.metric_range, "POP", report.iteration)
        if n % self.boundary or n >= max_epoch:
            return Decision.CONTINUE
        if self.kill_threshold is not None and report.metric < self.kill_threshold:
            if n == self.boundary:
                self._first_boundary(0.0)
            return self._terminate(tid, f"below the kill threshold at epoch {n}")
        p, ert = self._confidence(trial)
        if n == self.boundary:
            self._first_boundary(p)
        if p < self.min_confidence:
            return self._terminate(tid, f"confidence {p:.3f} < {self.min_confidence} at epoch {n}")
        self.confidence[tid] = p
        self.ert_s[tid] = ert
        self._classify()
        if tid in self.promising:
            return Decision.CONTINUE
        self._suspended.append(tid)
        return Decision.PAUSE

    def _confidence(self, trial: Trial) -> tuple[float, float]:
        n = trial.iteration
        epoch_s = trial.mean_iteration_s
        time_left = self._t_max - (self.experiment.now() - self._started_at)
        horizon = min(math.floor(time_left / epoch_s), self.experiment.max_iterations - n) if time_left > 0 else 0
        if horizon <= 0:
            return 0.0, max(time_left, 0.0)
        return confidence_and_ert(self._reach(trial, horizon), epoch_s, time_left)

    def _reach(self, trial: Trial, horizon: int) -> list[float]:
        """``P(y(n + m) >= y_target)`` for m = 1..`horizon` from the forecast of `trial`'s curve (epochs 1..n)."""
        n = trial.iteration
        check_in_range(trial, trial.metrics, self.metric_range, "POP")
        fc = forecast_trial(self.forecaster, trial, self.experiment.trials, self.experiment.max_iterations,
                            self.learn_prior, self.metric_range)
        reached_by = getattr(fc, "prob_reached_by", None)
        if reached_by is not None:  # first passage of the observed metric
            return [float(p) for p in reached_by(self.target, n + 1, n + horizon)]
        return [fc.prob_at_least(self.target, n + m) for m in range(1, horizon + 1)]

    def _classify(self) -> None:
        slots = self.experiment.total_atoms
        pool, threshold = promising_slots(list(self.confidence.values()), slots, self.atoms_per_trial)
        candidates = sorted((tid for tid, p in self.confidence.items() if p >= threshold),
                            key=lambda tid: (-self.confidence[tid], tid))
        chosen = candidates[: pool // self.atoms_per_trial]
        self.promising_pool = pool
        self.promising = {tid: self.confidence[tid] for tid in chosen}

    def _terminate(self, trial_id: int, reason: str) -> Decision:
        self.killed[trial_id] = reason
        self._forget(trial_id)
        return Decision.STOP

    def _forget(self, trial_id: int) -> None:
        self.confidence.pop(trial_id, None)
        self.ert_s.pop(trial_id, None)
        self.promising.pop(trial_id, None)

    def on_trial_end(self, trial: Trial) -> None:
        self._forget(trial.trial_id)
