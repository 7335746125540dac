"""Experiment specifications of early-stopping tuning jobs (RubberBand 3.1, Figure 6).

An `ExperimentSpec` is the declarative part of a successive-halving job that
RubberBand plans against: an ordered list of stages, each with a number of
trials and the iterations every trial trains *in that stage*. It is built

- from ``SHA(n, r, R, eta)`` (`sha_spec`): stage k keeps ``floor(n / eta^k)``
  trials, each trained ``r * eta^k`` more iterations; stages continue while a
  trial remains and the cumulative budget is below R, and the last stage is
  extended so its trials reach exactly R iterations. This reproduces the
  paper's examples: SHA(32, 1, 50, 3) -> trials 32, 10, 3, 1 over epoch ranges
  0-1, 1-4, 4-13, 13-50 (Table 3); SHA(64, 4, 508, 2) -> 7 stages ending at
  4 * (2^7 - 1) = 508 iterations (6.1.1);
- from Hyperband (`hyperband_spec`): brackets ``s = s_max .. 0`` with
  ``s_max = floor(log_eta(R / r))``, bracket s being
  ``SHA(ceil((s_max + 1) / (s + 1) * eta^s), R / eta^s, R, eta)`` (Li et al.).
  RubberBand runs the brackets "as a multi-job"; we run them one after the
  other, so the multi-job is the concatenation of the brackets' stages (a
  deviation: the paper does not say how brackets share the cluster);
- or explicitly, as a list of ``(trials, iterations)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from thrifty.core.errors import ProblemError

__all__ = ["Stage", "ExperimentSpec", "sha_spec", "hyperband_spec"]


@dataclass(frozen=True)
class Stage:
    """One stage: `trials` trials, each trained `iters` iterations in this stage."""

    trials: int
    iters: int


@dataclass(frozen=True)
class ExperimentSpec:
    stages: tuple[Stage, ...]
    description: str = ""

    def __post_init__(self) -> None:
        if not self.stages:
            raise ProblemError("has no stages; a tuning job needs at least one", path="stages")
        for i, s in enumerate(self.stages):
            if s.trials < 1:
                raise ProblemError(f"is {s.trials}, but must be at least 1", path=f"stages[{i}].trials")
            if s.iters < 1:
                raise ProblemError(f"is {s.iters}, but must be at least 1", path=f"stages[{i}].iters")

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def get_stage(self, index: int) -> tuple[int, int]:
        """(trials, iterations per trial) of stage `index` (the paper's API)."""
        s = self.stages[index]
        return s.trials, s.iters

    @property
    def trial_iterations(self) -> int:
        """Total iterations over all trials: the job's work in single-trial iterations."""
        return sum(s.trials * s.iters for s in self.stages)

    @classmethod
    def explicit(cls, stages: list[tuple[int, int]], description: str = "explicit") -> "ExperimentSpec":
        return cls(tuple(Stage(int(n), int(i)) for n, i in stages), description)


def _check_sha(n: int, r: int, R: int, eta: float, path: str) -> None:
    if n < 1:
        raise ProblemError(f"is {n}, but must be at least 1", path=f"{path}.trials")
    if r < 1:
        raise ProblemError(f"is {r}, but must be at least 1", path=f"{path}.min_iters")
    if r > R:
        raise ProblemError(f"{r} is larger than max_iters {R}", path=f"{path}.min_iters")
    if not eta > 1:
        raise ProblemError(f"is {eta}, but must be greater than 1", path=f"{path}.eta")


def sha_stages(n: int, r: int, R: int, eta: float) -> list[Stage]:
    """The stages of SHA(n, r, R, eta) (see the module docstring)."""
    _check_sha(n, r, R, eta, "experiment")
    stages: list[Stage] = []
    done = 0  # cumulative iterations of a surviving trial
    k = 0
    while True:
        trials = int(math.floor(n / eta**k + 1e-9))
        if trials < 1 or done >= R:
            break
        iters = int(round(r * eta**k))
        iters = min(iters, R - done)
        stages.append(Stage(trials, iters))
        done += iters
        k += 1
    # the last stage trains its survivors up to R (Table 3: epochs 13-50)
    last = stages[-1]
    stages[-1] = Stage(last.trials, last.iters + (R - done))
    return stages


def sha_spec(n: int, r: int, R: int, eta: float = 2) -> ExperimentSpec:
    return ExperimentSpec(tuple(sha_stages(n, r, R, eta)), f"SHA(n={n}, r={r}, R={R}, eta={eta:g})")


def hyperband_spec(r: int, R: int, eta: float = 3) -> ExperimentSpec:
    """Hyperband's brackets run one after another as one multi-job."""
    _check_sha(1, r, R, eta, "experiment")
    s_max = int(math.floor(math.log(R / r, eta) + 1e-9))
    stages: list[Stage] = []
    for s in range(s_max, -1, -1):
        n = int(math.ceil((s_max + 1) / (s + 1) * eta**s))
        r_s = max(1, int(round(R / eta**s)))
        stages.extend(sha_stages(n, min(r_s, R), R, eta))
    return ExperimentSpec(tuple(stages), f"Hyperband(r={r}, R={R}, eta={eta:g}), {s_max + 1} brackets")
