"""ASHA with pausing, as HyperSched describes and compares against (3.3, Algorithms 1-2).

Parameters: r (`min_iterations`), R (`max_iterations`, defaults to the
experiment's), eta (reduction factor). Rungs sit at r, r*eta, r*eta^2, ... < R.

- on a result at a rung's milestone, record the score; the trial continues if
  it is in the top floor(n / eta) of the n trials recorded at that rung, else
  it is paused (Algorithm 2; so a rung's first eta - 1 arrivals pause, Fig. 2);
- at R the trial completes;
- when atoms are free (the trivial entrance policy, ``len(liveTrials) < N``),
  resume a paused trial that is in the top floor(n / eta) of its rung, with
  rungs checked in descending order and the best such trial first; if there is
  none, start a new configuration (Algorithm 1, ``start_next_trial``).

Every trial holds `atoms_per_trial` atoms (1 in HyperSched's comparisons);
ASHA never resizes.
"""

from __future__ import annotations

from thrifty.runtime.tuning.schedulers.base import (Decision, Scheduler, Start, check_atoms_per_trial, check_eta,
                                                    check_min_max_iterations, rung_milestones)
from thrifty.runtime.tuning.schedulers.rungs import Rung, asha_top_k
from thrifty.runtime.tuning.trial import Report, Trial, TrialState

__all__ = ["ASHA"]


class ASHA(Scheduler):
    name = "asha"

    def __init__(self, min_iterations: int = 1, eta: float = 4, max_iterations: int | None = None,
                 atoms_per_trial: int = 1):
        super().__init__()
        check_min_max_iterations(min_iterations, max_iterations)
        check_eta(eta)
        self.min_iterations = min_iterations
        self.eta = eta
        self._max_iterations = max_iterations
        self.atoms_per_trial = atoms_per_trial
        self.rungs: list[Rung] = []
        self._rung_at: dict[int, int] = {}
        self._top_rung: dict[int, int] = {}   # trial id -> index of the highest rung it reached

    @property
    def max_iterations(self) -> int:
        return self._max_iterations if self._max_iterations is not None else self.experiment.max_iterations

    def bind(self, experiment) -> None:
        super().bind(experiment)
        check_atoms_per_trial(self.atoms_per_trial, experiment.total_atoms)
        check_min_max_iterations(self.min_iterations, self.max_iterations)
        self.rungs = [Rung(m) for m in rung_milestones(self.min_iterations, self.max_iterations, self.eta)]
        self._rung_at = {rung.milestone: j for j, rung in enumerate(self.rungs)}

    def choose(self) -> Start | None:
        exp = self.experiment
        if exp.free_atoms < self.atoms_per_trial:
            return None
        promoted = self._promotable()
        if promoted is not None:
            return Start(promoted, self.atoms_per_trial)
        if exp.has_more_configs():
            return Start(None, self.atoms_per_trial)
        return None

    def _promotable(self) -> int | None:
        """The best paused trial in the top floor(n/eta) of its rung, rungs in descending order."""
        for rung in reversed(self.rungs):
            best = rung.best_paused()
            if best is not None and rung.in_top(best, asha_top_k(len(rung), self.eta)):
                return best
        return None

    def on_result(self, trial: Trial, report: Report) -> Decision:
        if report.iteration >= self.max_iterations:
            return Decision.STOP
        j = self._rung_at.get(report.iteration)
        if j is None:
            return Decision.CONTINUE
        rung = self.rungs[j]
        rung.record(trial.trial_id, report.metric)
        self._top_rung[trial.trial_id] = j
        if rung.in_top(trial.trial_id, asha_top_k(len(rung), self.eta)):
            return Decision.CONTINUE
        rung.add_paused(trial.trial_id)
        return Decision.PAUSE

    def on_restored(self) -> None:
        """Each rung's paused queue: exactly the paused trials whose highest rung it is (a trial paused
        at a lower rung and promoted since is in no lower rung's queue)."""
        paused = {tid for tid, t in self.experiment.trials.items() if t.state == TrialState.PAUSED}
        for rung in self.rungs:
            for trial_id in list(rung.paused_best_first()):
                rung.remove_paused(trial_id)
        for trial_id, j in self._top_rung.items():
            if trial_id in paused:
                self.rungs[j].add_paused(trial_id)

    def on_trial_start(self, trial: Trial) -> None:
        j = self._top_rung.get(trial.trial_id)
        if j is not None:
            self.rungs[j].remove_paused(trial.trial_id)
