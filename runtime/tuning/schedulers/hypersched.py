"""HyperSched: deadline-aware ASHA with dynamic resource allocation (SoCC 2019, 4-5).

Inputs (4.1): deadline T, atoms N, scaling function s(a) (progress rate on a
atoms, need not be exact), and ASHA's r, R, eta. Rungs at r, r*eta, ... < R.

Exploration (4.2):

- *Speculative evaluation*: at every result, for every rung the trial has
  reached, the trial is paused if its score at that rung is not in the top
  1/eta of all trials seen at the rung (``ceil(n / eta)``, so a rung's first
  arrivals continue); the check repeats as new trials arrive, which pauses
  early arrivals that turn out poor (no head-of-line blocking).
- *Entrance policy* (Algorithm 3, lines 5-9): start or resume a trial only if
  atoms are free and ``min(R * T_a, eta * T') < T_n``, where T_a is the
  measured median time of one iteration on one atom, T' the longest duration
  any trial has trained, and T_n the time left until the deadline (ablation:
  ``deadline_entrance=False`` admits whenever atoms are free; see deviation
  (6) for atoms no running trial would use). When it admits, the next trial is
  chosen as in Algorithm 1's ``start_next_trial``:
  the best paused trial in the top floor(n / eta) of its rung (rungs in
  descending order, and it must also pass the speculative check at every
  rung it reached), else a new configuration; each starts on one atom.
  (Ablation, Fig. 5: ``speculative=False`` pauses with ASHA's rule instead.)

Exploitation (4.3, Algorithm 3 lines 21-25): after a CONTINUE the running
trials are sorted best first and the N atoms are dealt round-robin over them
(1 each, the leftover to the best first). A trial grows to its share
``a'`` (at most what is free) only if the deadline-aware gain beats the
overhead, ``(T_n - T_o) * s(a') > T_n * s(a)`` with T_o the measured median
start-up/resize overhead, and only once it has run `cooldown` iterations
since its last launch or resize.

Deviations, stated: (1) a trial whose share fell below its atoms (a better
trial overtook it) shrinks to its share after the cooldown without the gain
test, which a shrink can never pass; HyperSched's released implementation also
executes every deallocation, and without it the round-robin share cannot move
to better trials. (2) The paper does not give COOLDOWN; the default is 5
iterations. (3) T' is the longest *training* time (sum of iteration times) of
any trial. (4) Before any overhead is measured, T_o is `overhead_s` (a profiled
prior, 4.3 "users can profile ... the startup time") or 0. (5) 4.2's prose says
HyperSched "will not continue to launch new trials" when the inequality holds;
Algorithm 3 (``should_enter = min(R T_a, t_f eta) < T_n``) admits exactly when it
holds, the reading consistent with the rest of 4.2, and is what this follows.
(6) Idle atoms help no one, so the rules that leave atoms free apply only
when those atoms have a use. A speculative pause happens only if there is a new
configuration or a promotable paused trial to start, or a running trial would
grow into the freed atoms; otherwise the trial keeps training (the best score
at the deadline can only gain). When nothing is left to start and no running
trial would grow into the free atoms, the best paused trial resumes on one of
them. The entrance closes only when exploitation
would use the free atoms: if
no running trial would grow into them (4.3's gain test fails for every one,
as under NONE scaling, or dynamic allocation is off), a closed entrance only
leaves atoms idle until the deadline, so the next trial is admitted anyway.
With NONE scaling, idle atoms left HyperSched behind ASHA in 4 of 48 cells of
the synthetic benchmark; with this rule, in 1 (within one sd).
``use_idle_atoms=False`` follows the paper's rules verbatim.
"""

from __future__ import annotations

import math

from thrifty.core.errors import ProblemError
from thrifty.runtime.tuning.schedulers.asha import ASHA
from thrifty.runtime.tuning.schedulers.base import (Decision, RunningMedian, ScalingFunction, Start, check_positive,
                                                    scaling_function)
from thrifty.runtime.tuning.schedulers.rungs import asha_top_k, speculative_top_k
from thrifty.runtime.tuning.trial import Report, Trial, TrialState

__all__ = ["HyperSched", "should_enter", "worth_resizing", "uniform_share"]


def should_enter(time_left: float, full_trial_s: float, longest_trial_s: float, eta: float) -> bool:
    """HyperSched's entrance test ``min(R * T_a, eta * T') < T_n`` (Algorithm 3, line 8)."""
    return min(full_trial_s, eta * longest_trial_s) < time_left


def worth_resizing(time_left: float, overhead_s: float, rate_now: float, rate_new: float) -> bool:
    """Resize only if ``(T_n - T_o) * s(a') > T_n * s(a)`` (4.3, Algorithm 3 line 23)."""
    return (time_left - overhead_s) * rate_new > time_left * rate_now


def uniform_share(rank: int, n_trials: int, total_atoms: int) -> int:
    """Atoms of the trial at `rank` (0 = best) when `total_atoms` are dealt one at a
    time, round-robin, over `n_trials` trials sorted best first (4.3, Section 5)."""
    base, extra = divmod(total_atoms, n_trials)
    return base + (1 if rank < extra else 0)


class HyperSched(ASHA):
    """ASHA's rungs and pausing (the parent class) with HyperSched's exploration and exploitation."""

    name = "hypersched"

    def __init__(self, min_iterations: int = 1, eta: float = 4, max_iterations: int | None = None, *,
                 scaling: str | ScalingFunction = "LINEAR", deadline: float | None = None, cooldown: int = 5,
                 overhead_s: float | None = None, speculative: bool = True, dynamic_allocation: bool = True,
                 deadline_entrance: bool = True, use_idle_atoms: bool = True):
        super().__init__(min_iterations, eta, max_iterations, atoms_per_trial=1)
        if deadline is not None:
            check_positive("deadline", deadline)
        if not isinstance(cooldown, int) or cooldown < 0:
            raise ProblemError(f"`cooldown` is {cooldown!r}, but must be an integer >= 0", path="cooldown")
        if overhead_s is not None and not (math.isfinite(overhead_s) and overhead_s >= 0):
            raise ProblemError(f"`overhead_s` is {overhead_s!r}, but must be >= 0", path="overhead_s")
        self.scale = scaling_function(scaling)
        self._deadline = deadline
        self.cooldown = cooldown
        self.overhead_prior_s = overhead_s
        self.speculative = speculative
        self.dynamic_allocation = dynamic_allocation
        self.deadline_entrance = deadline_entrance
        self.use_idle_atoms = use_idle_atoms
        self._one_atom_iteration_s = RunningMedian()
        self._longest_trial_s = 0.0
        self._target: dict[int, int] = {}
        self._deadline_at = math.inf

    def bind(self, experiment) -> None:
        super().bind(experiment)
        if self._deadline is not None:
            self._deadline_at = experiment.now() + self._deadline
        elif experiment.deadline is not None:
            self._deadline_at = experiment.deadline
        else:
            raise ProblemError("HyperSched needs a deadline: give the experiment one, or HyperSched(deadline=...)",
                               path="deadline")

    # --- measured quantities ----------------------------------------------------------
    def time_left(self) -> float:
        """T_n."""
        return self._deadline_at - self.experiment.now()

    def overhead_s(self) -> float:
        """T_o: the median measured start-up/resize overhead (the prior before any)."""
        measured = self.experiment.median_overhead_s()
        if not math.isnan(measured):
            return measured
        return self.overhead_prior_s or 0.0

    def full_trial_s(self) -> float:
        """R * T_a: one new trial trained to R on one atom (inf before T_a is measured)."""
        t_a = self._one_atom_iteration_s.median(default=math.inf)
        return self.max_iterations * t_a

    # --- exploration --------------------------------------------------------------------
    def choose(self) -> Start | None:
        free = self.experiment.free_atoms
        if free < 1:
            return None
        idle = self.use_idle_atoms and not self._exploitation_would_use(free)  # no running trial would take them
        if self.deadline_entrance and not idle and not should_enter(self.time_left(), self.full_trial_s(),
                                                                    self._longest_trial_s, self.eta):
            return None
        start = super().choose()  # Algorithm 1's start_next_trial: promote the best paused trial, else a new one
        return self._best_paused() if start is None and idle else start

    def _best_paused(self) -> Start | None:
        """The paused trial with the best latest score, whether or not it is promotable."""
        paused = [t for t in self.experiment.trials.values() if t.state == TrialState.PAUSED]
        if not paused:
            return None
        best = max(paused, key=lambda t: (t.last_metric, -t.trial_id))
        return Start(best.trial_id, self.atoms_per_trial)

    def _exploitation_would_use(self, free: int, besides: Trial | None = None) -> bool:
        """Whether some running trial (other than `besides`) would grow into `free`
        atoms (4.3's gain test)."""
        if not self.dynamic_allocation:
            return False
        time_left, overhead = self.time_left(), self.overhead_s()
        return any(worth_resizing(time_left, overhead, self.scale(t.atoms), self.scale(t.atoms + free))
                   for t in self.experiment.running_trials() if t is not besides)

    def _freed_atoms_have_a_use(self, trial: Trial) -> bool:
        """Whether pausing `trial` frees atoms for something: a new configuration, a
        promotable paused trial, or a running trial that would grow into them."""
        exp = self.experiment
        if exp.has_more_configs() or self._promotable() is not None:
            return True
        return self._exploitation_would_use(exp.free_atoms + trial.atoms, besides=trial)

    def _promotable(self) -> int | None:
        for j in range(len(self.rungs) - 1, -1, -1):
            rung = self.rungs[j]
            k = asha_top_k(len(rung), self.eta)
            for trial_id in rung.paused_best_first():
                if not rung.in_top(trial_id, k):
                    break  # the others at this rung score lower
                if self._passes_rungs(trial_id, j):
                    return trial_id
        return None

    def _passes_rungs(self, trial_id: int, top: int) -> bool:
        """Speculative evaluation: in the top 1/eta seen at every rung reached."""
        for rung in self.rungs[top::-1]:
            if not rung.in_top(trial_id, speculative_top_k(len(rung), self.eta)):
                return False
        return True

    def on_result(self, trial: Trial, report: Report) -> Decision:
        if report.atoms == 1:
            self._one_atom_iteration_s.add(report.iteration_s)
        self._longest_trial_s = max(self._longest_trial_s, trial.train_s)
        if report.iteration >= self.max_iterations:
            return Decision.STOP
        if self._should_pause(trial, report):
            self.rungs[self._top_rung[trial.trial_id]].add_paused(trial.trial_id)
            return Decision.PAUSE
        if self.dynamic_allocation:
            self._plan_allocation(trial)
        return Decision.CONTINUE

    def _should_pause(self, trial: Trial, report: Report) -> bool:
        tid = trial.trial_id
        j = self._rung_at.get(report.iteration)
        if j is not None:
            self.rungs[j].record(tid, report.metric)
            self._top_rung[tid] = j
        if not self.speculative:  # ablation (Fig. 5): ASHA's rule, on arrival only
            return j is not None and not self.rungs[j].in_top(tid, asha_top_k(len(self.rungs[j]), self.eta))
        top = self._top_rung.get(tid)
        return (top is not None and not self._passes_rungs(tid, top)
                and (not self.use_idle_atoms or self._freed_atoms_have_a_use(trial)))

    # --- exploitation -------------------------------------------------------------------
    def _plan_allocation(self, trial: Trial) -> None:
        if trial.iterations_since_launch <= self.cooldown:
            return
        exp = self.experiment
        running = exp.running_trials()
        key = (trial.last_metric, -trial.trial_id)
        rank = sum((t.last_metric, -t.trial_id) > key for t in running)
        proposed = min(uniform_share(rank, len(running), exp.total_atoms), trial.atoms + exp.free_atoms)
        if proposed < trial.atoms:
            self._target[trial.trial_id] = proposed
        elif proposed > trial.atoms and worth_resizing(self.time_left(), self.overhead_s(),
                                                       self.scale(trial.atoms), self.scale(proposed)):
            self._target[trial.trial_id] = proposed

    def target_atoms(self, trial: Trial) -> int:
        return self._target.pop(trial.trial_id, trial.atoms)

    def on_trial_end(self, trial: Trial) -> None:
        self._target.pop(trial.trial_id, None)
