"""HyperDrive's Default scheduling policy (4.2, 6.1): first in, first out, to completion.

"The default SAP simply greedily allocates idle jobs to idle machines ... This
policy ignores all application statistics and iteration finish up-calls."
Each trial gets `atoms_per_trial` atoms (k; a sequential job has k = 1) and
runs until it completes R iterations; configurations start in the order the
search space produces them. Bandit and EarlyTerm extend it (5.3).
"""

from __future__ import annotations

from thrifty.runtime.tuning.schedulers.base import Decision, Scheduler, Start, check_atoms_per_trial, check_positive
from thrifty.runtime.tuning.trial import Report, Trial

__all__ = ["FIFO"]


class FIFO(Scheduler):
    name = "default"

    def __init__(self, atoms_per_trial: int = 1):
        super().__init__()
        check_positive("atoms_per_trial", atoms_per_trial, integer=True)
        self.atoms_per_trial = atoms_per_trial

    def bind(self, experiment) -> None:
        super().bind(experiment)
        check_atoms_per_trial(self.atoms_per_trial, experiment.total_atoms)

    def choose(self) -> Start | None:
        exp = self.experiment
        if exp.free_atoms >= self.atoms_per_trial and exp.has_more_configs():
            return Start(None, self.atoms_per_trial)
        return None

    def on_result(self, trial: Trial, report: Report) -> Decision:
        return Decision.CONTINUE
