"""Tuning runtime: the scheduler contract over every scheduler, ASHA and HyperSched
against hand-computed runs, HyperSched's resize rule, POP's classification,
the simulated executor (synthetic and trace replay), search spaces, bad input."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pytest

from thrifty.core.errors import ProblemError
from thrifty.runtime.tuning import (ASHA, FIFO, POP, Bandit, CallableSearch, Choice, ConfigList, Decision,
                                    EarlyTerm, Exponential, GridSearch, HyperSched, IntUniform, LogUniform, Memoized,
                                    RandomSearch, RealClock, Report, SchedulerError, SimulatedExecutor, Start, Trial,
                                    SyntheticWorkload, TraceWorkload, TrialFailedError, TrialState, Uniform,
                                    configuration_orders, rung_milestones, run_experiment, synthetic_score,
                                    synthetic_search_space)
from thrifty.runtime.tuning.schedulers.bandit import action_elimination_continues
from thrifty.runtime.tuning.executors.plan import record_result
from thrifty.runtime.tuning.schedulers.base import RunningMedian
from thrifty.runtime.tuning.schedulers.hypersched import should_enter, uniform_share, worth_resizing
from thrifty.runtime.tuning.loop import Resumed
from thrifty.runtime.tuning.schedulers.pop import confidence_and_ert, promising_slots


# --- small fakes ------------------------------------------------------------------------

class FakeForecast:
    """Linear extrapolation of the curve's average slope with a Gaussian band that widens with the horizon."""

    def __init__(self, epochs, values):
        self.n = epochs[-1]
        self.last = values[-1]
        self.slope = (values[-1] - values[0]) / (len(values) - 1) if len(values) > 1 else 0.0

    def mean(self, epoch):
        return min(1.0, self.last + self.slope * (epoch - self.n))

    def prob_at_least(self, y, epoch):
        sd = 0.02 + 0.01 * max(epoch - self.n, 0)
        return 0.5 * math.erfc((y - self.mean(epoch)) / (sd * math.sqrt(2)))


def fake_forecaster(epochs, values, max_epoch, *, seed=0):
    if len(values) == 0 or any(math.isnan(v) for v in values):
        raise ValueError("empty or NaN curve")
    return FakeForecast(list(epochs), list(values))


@dataclass(frozen=True)
class Curve:
    accuracy: tuple
    epoch_s: tuple


class ConstantWorkload:
    """Every iteration of config {"q": q} reports q and takes `step_s` / atoms."""

    def __init__(self, step_s=1.0, crash_at=None, nan_at=None):
        self.step_s, self.crash_at, self.nan_at = step_s, crash_at or {}, nan_at or {}

    def metric(self, config, iteration):
        if self.crash_at.get(config["q"]) == iteration:
            raise RuntimeError("CUDA out of memory (injected)")
        if self.nan_at.get(config["q"]) == iteration:
            return float("nan")
        return config["q"]

    def iteration_s(self, config, iteration, atoms):
        return self.step_s / atoms


def configs(*qs):
    return ConfigList([{"q": q} for q in qs])


def report_order(result):
    """(trial id, iteration) of every result, in arrival order."""
    events = [(at, t.trial_id, i + 1) for t in result.trials for i, at in enumerate(t.reported_at)]
    return [(tid, it) for _, tid, it in sorted(events)]


# --- the contract every scheduler passes --------------------------------------------------

SCHEDULERS = {
    "default": lambda: FIFO(),
    "asha": lambda: ASHA(min_iterations=2, eta=3),
    "hypersched": lambda: HyperSched(min_iterations=2, eta=3, scaling="SQRT"),
    "pop": lambda: POP(0.62, boundary=4, kill_threshold=0.05, forecaster=fake_forecaster),
    "bandit": lambda: Bandit(boundary=4),
    "earlyterm": lambda: EarlyTerm(boundary=4, forecaster=fake_forecaster),
}


class Auditor:
    """Wraps a scheduler: checks what the loop tells it and what it answers."""

    def __init__(self, inner, total_atoms):
        self.inner, self.total = inner, total_atoms
        self.heard, self.decisions, self.starts = 0, [], 0

    def bind(self, experiment):
        self.exp = experiment
        self.inner.bind(experiment)

    def _check_atoms(self):
        used = sum(t.atoms for t in self.exp.running_trials())
        assert used + self.exp.free_atoms == self.total and 0 <= used <= self.total

    def choose(self):
        self._check_atoms()
        start = self.inner.choose()
        assert start is None or isinstance(start, Start)
        return start

    def on_result(self, trial, report):
        self._check_atoms()
        assert trial.state == TrialState.RUNNING and report.trial_id == trial.trial_id
        assert report.iteration == trial.iteration and trial.metrics[-1] == report.metric
        self.heard += 1
        decision = self.inner.on_result(trial, report)
        assert isinstance(decision, Decision)
        self.decisions.append(decision)
        return decision

    def target_atoms(self, trial):
        return self.inner.target_atoms(trial)

    def on_trial_start(self, trial):
        self.starts += 1
        assert trial.state == TrialState.RUNNING and trial.atoms >= 1
        self.inner.on_trial_start(trial)

    def on_trial_end(self, trial):
        assert trial.state in (TrialState.COMPLETED, TrialState.TERMINATED, TrialState.FAILED)
        self.inner.on_trial_end(trial)


def contract_run(make, crash=False):
    workload = SyntheticWorkload("SQRT", step_s=0.1)
    if crash:
        good = workload

        class Crashing:
            def metric(self, config, k):
                if config["b1"] < 0.15 and k == 3:
                    raise RuntimeError("injected crash")
                if config["b1"] > 0.9 and k == 2:
                    return float("nan")
                return good.metric(config, k)

            def iteration_s(self, config, k, atoms):
                return good.iteration_s(config, k, atoms)

        workload = Crashing()
    auditor = Auditor(make(), 6)
    result = run_experiment(auditor, SimulatedExecutor(workload, startup_s=0.05), synthetic_search_space(3, 40),
                            total_atoms=6, max_iterations=24, deadline=40.0)
    return auditor, result


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler_contract(name):
    auditor, result = contract_run(SCHEDULERS[name])
    assert auditor.heard == result.results == sum(t.iteration for t in result.trials) > 0
    assert result.end_reason in ("deadline", "exhausted")
    assert result.ended_at <= 40.0 + 1e-9
    for t in result.trials:
        # the history is the workload's, iteration by iteration, whatever the pauses and resizes
        expected = [synthetic_score(k, t.config["b0"], t.config["b1"], t.config["b2"])
                    for k in range(1, t.iteration + 1)]
        assert t.metrics == pytest.approx(expected)
        assert all(at <= 40.0 + 1e-9 for at in t.reported_at)
        assert t.atoms == 0 and t.state != TrialState.RUNNING
        assert len(t.iteration_atoms) == t.iteration and t.launches >= 1
        if t.state == TrialState.COMPLETED:
            assert t.iteration == 24
        if t.state == TrialState.PAUSED:
            assert t.checkpoint == {"iteration": t.iteration}
        assert t.state != TrialState.FAILED
    assert result.best_metric == max(max(t.metrics) for t in result.trials if t.metrics)
    # same configuration order and the same answers on a second run
    _, again = contract_run(SCHEDULERS[name])
    assert [t.config for t in again.trials] == [t.config for t in result.trials]
    assert [t.metrics for t in again.trials] == [t.metrics for t in result.trials]


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler_contract_with_failing_trials(name):
    auditor, result = contract_run(SCHEDULERS[name], crash=True)
    failed = [t for t in result.trials if t.state == TrialState.FAILED]
    assert failed, "the workload crashes some configurations"
    for t in failed:
        assert t.error and result.failed[t.trial_id] == t.error
        assert ("injected crash" in t.error and t.config["b1"] < 0.15) or ("nan" in t.error and t.config["b1"] > 0.9)
    # the experiment went on past the failures
    assert any(t.state != TrialState.FAILED and t.iteration >= 3 for t in result.trials)
    assert auditor.heard == result.results


def test_fail_fast_raises_a_clear_error():
    with pytest.raises(TrialFailedError, match="trial 1 .*RuntimeError: CUDA out of memory"):
        run_experiment(FIFO(), SimulatedExecutor(ConstantWorkload(crash_at={0.7: 2})), configs(0.5, 0.7, 0.9),
                       total_atoms=2, max_iterations=4, fail_fast=True)


def test_same_loop_on_a_real_clock():
    """Sequential ASHA decides the same on a real clock as on the virtual one."""
    def run(clock):
        executor = SimulatedExecutor(ConstantWorkload(step_s=0.002), clock=clock)
        return run_experiment(ASHA(min_iterations=1, eta=2), executor, configs(0.5, 0.9, 0.7, 0.2),
                              total_atoms=1, max_iterations=4)

    virtual, real = run(None), run(RealClock())
    assert report_order(real) == report_order(virtual)
    assert [t.state for t in real.trials] == [t.state for t in virtual.trials]
    assert real.ended_at >= 8 * 0.002


# --- ASHA ---------------------------------------------------------------------------------

def test_rung_milestones():
    assert rung_milestones(5, 500, 4) == [5, 20, 80, 320]
    assert rung_milestones(1, 4, 2) == [1, 2]
    assert rung_milestones(1, 10, 1.5) == [1, 2, 3, 4, 6, 8]   # ceil(1.5^k)
    assert rung_milestones(4, 4, 2) == []


def test_asha_promotion_hand_computed():
    """eta 2, r 1, R 4 (rungs at 1 and 2), one atom, scores 0.5, 0.9, 0.7, 0.2:

    T0 pauses at rung 1 (floor(1/2) = 0 continue); T1 continues (top 1 of 2) and
    pauses at rung 2 (alone there); T2 pauses (0.9 is better, top 1 of 3); T3
    pauses; now rung 1 keeps floor(4/2) = 2, so T2 is promoted and pauses at rung 2
    (top 1 of 2 is T1); rungs are checked in descending order, so T1 is promoted
    from rung 2 next and completes; nothing else is promotable."""
    result = run_experiment(ASHA(min_iterations=1, eta=2), SimulatedExecutor(ConstantWorkload()),
                            configs(0.5, 0.9, 0.7, 0.2), total_atoms=1, max_iterations=4)
    assert report_order(result) == [(0, 1), (1, 1), (1, 2), (2, 1), (3, 1), (2, 2), (1, 3), (1, 4)]
    assert [t.state for t in result.trials] == [TrialState.PAUSED, TrialState.COMPLETED, TrialState.PAUSED,
                                                TrialState.PAUSED]
    assert [t.iteration for t in result.trials] == [1, 4, 2, 1]
    assert result.end_reason == "exhausted"


def test_asha_stops_at_its_own_R():
    # r = R = 3: no rung to pause at
    result = run_experiment(ASHA(min_iterations=3, eta=2, max_iterations=3), SimulatedExecutor(ConstantWorkload()),
                            configs(0.9), total_atoms=1, max_iterations=10)
    trial = result.trials[0]
    assert trial.iteration == 3 and trial.state == TrialState.TERMINATED


# --- HyperSched -----------------------------------------------------------------------------

def test_hypersched_speculative_evaluation_hand_computed():
    """eta 2, r 1, R 4, two atoms, NONE scaling (no resize), scores 0.2, 0.9, 0.8, 0.7.

    T0 is a rung's first arrival and continues (ASHA would pause it); at t=2 T1's
    rung-1 score (0.9) makes T0 no longer top ceil(2/2) = 1 there, so T0 is paused
    retrospectively; T2 takes its atom and continues (top 2 of 3 at rung 1, of 3
    at rung 2); T3 (0.7) is 3rd of 4 at rung 1 and pauses."""
    result = run_experiment(HyperSched(min_iterations=1, eta=2, scaling="NONE", use_idle_atoms=False),
                            SimulatedExecutor(ConstantWorkload()), configs(0.2, 0.9, 0.8, 0.7),
                            total_atoms=2, max_iterations=4, deadline=1000)
    assert [t.state for t in result.trials] == [TrialState.PAUSED, TrialState.COMPLETED, TrialState.COMPLETED,
                                                TrialState.PAUSED]
    assert [t.iteration for t in result.trials] == [2, 4, 4, 1]
    assert [t.reported_at[0] for t in result.trials] == [1, 1, 3, 5]


def test_hypersched_pauses_only_when_the_freed_atom_has_a_use():
    """The run above with idle atoms used: T0's pause at t=2 frees an atom for T2 (a new
    configuration), so it happens; T3's at t=6 would free one for nothing (no configuration left,
    no promotable trial, no scaling), so T3 keeps training; when T2 finishes at t=6, the paused
    T0 resumes on the idle atom and completes too."""
    result = run_experiment(HyperSched(min_iterations=1, eta=2, scaling="NONE"),
                            SimulatedExecutor(ConstantWorkload()), configs(0.2, 0.9, 0.8, 0.7),
                            total_atoms=2, max_iterations=4, deadline=1000)
    assert [t.state for t in result.trials] == [TrialState.COMPLETED] * 4
    assert [t.reported_at[0] for t in result.trials] == [1, 1, 3, 5]
    t3 = result.trials[3]
    assert t3.reported_at == [5, 6, 7, 8]  # no pause after its first iteration
    assert result.trials[0].reported_at == [1, 2, 7, 8]


def test_hypersched_entrance_policy_stops_new_trials_near_the_deadline():
    # T_a = 1 (one atom), R = 50: R * T_a = 50 >= T_n, so trials enter while eta * T' < T_n
    assert should_enter(time_left=30, full_trial_s=50, longest_trial_s=7, eta=4)
    assert not should_enter(time_left=28, full_trial_s=50, longest_trial_s=7, eta=4)
    assert should_enter(time_left=60, full_trial_s=50, longest_trial_s=100, eta=4)
    # two atoms, step 1, R = 50, eta = 4; T0 (0.9) leads, every later trial is worse and pauses after one
    # iteration, freeing its atom: a new trial enters at t = 0, 0, 1, .., 5 while 4 * T' < 30 - t (T' = t),
    # and at t = 6 (24 < 24 fails) the freed atom stays idle until the deadline
    result = run_experiment(HyperSched(min_iterations=1, eta=4, scaling="NONE", use_idle_atoms=False),
                            SimulatedExecutor(ConstantWorkload()), configs(0.9, *[0.1 - 0.01 * i for i in range(10)]),
                            total_atoms=2, max_iterations=50, deadline=30)
    assert [t.created_at for t in result.trials] == [0, 0, 1, 2, 3, 4, 5]
    assert result.trials[0].iteration == 30 and result.end_reason == "deadline"
    assert all(t.state == TrialState.PAUSED and t.iteration == 1 for t in result.trials[1:])
    # with idle atoms used, the closed entrance admits anyway (no running trial would grow into
    # the atom under NONE scaling): every configuration enters (T1, promoted at t=7, runs to its
    # rung at 4 first), and the last, with nothing left to start, keeps its atom to the deadline
    result = run_experiment(HyperSched(min_iterations=1, eta=4, scaling="NONE"),
                            SimulatedExecutor(ConstantWorkload()), configs(0.9, *[0.1 - 0.01 * i for i in range(10)]),
                            total_atoms=2, max_iterations=50, deadline=30)
    assert [t.created_at for t in result.trials] == [0, 0, 1, 2, 3, 4, 5, 6, 10, 11, 12]
    assert result.trials[0].iteration == 30 and result.trials[1].iteration == 4
    assert all(t.iteration == 1 for t in result.trials[2:-1]) and result.trials[-1].iteration == 30 - 12


@pytest.mark.parametrize("time_left, overhead, a, a_new, scaling, expected", [
    (10, 2, 1, 2, "LINEAR", True),    # 8 * 2 = 16 > 10
    (10, 2, 1, 2, "SQRT", True),      # 8 * 1.414 = 11.3 > 10
    (10, 3, 1, 2, "SQRT", False),     # 7 * 1.414 = 9.9 < 10
    (10, 5, 2, 4, "LINEAR", False),   # 5 * 4 = 20 == 10 * 2: not strictly better
    (10, 0, 1, 8, "NONE", False),     # no scaling, no gain
])
def test_hypersched_resize_rule(time_left, overhead, a, a_new, scaling, expected):
    from thrifty.runtime.tuning import scaling_function

    s = scaling_function(scaling)
    assert worth_resizing(time_left, overhead, s(a), s(a_new)) is expected


def test_uniform_share_round_robin():
    assert [uniform_share(r, 3, 8) for r in range(3)] == [3, 3, 2]
    assert [uniform_share(r, 5, 5) for r in range(5)] == [1] * 5
    assert uniform_share(0, 1, 16) == 16


def hypersched_run(startup_s, cooldown=3):
    return run_experiment(HyperSched(min_iterations=2, eta=2, scaling="LINEAR", cooldown=cooldown),
                          SimulatedExecutor(SyntheticWorkload("LINEAR", step_s=1.0), startup_s=startup_s),
                          synthetic_search_space(1), total_atoms=4, max_iterations=200, deadline=60)


def test_hypersched_grows_the_best_trial_after_its_cooldown():
    result = hypersched_run(startup_s=0.0, cooldown=3)
    grown = [t for t in result.trials if max(t.iteration_atoms, default=0) > 1]
    assert grown and sum(t.resizes for t in result.trials) > 0
    best = result.trials[result.best_trial_id]
    assert max(best.iteration_atoms) == 4
    for t in result.trials:
        # between relaunches the allocation holds for more than `cooldown` iterations
        runs = [len(list(g)) for _, g in itertools.groupby(t.iteration_atoms)]
        assert all(n > 3 for n in runs[:-1]), (t.trial_id, t.iteration_atoms)


def test_hypersched_does_not_resize_when_measured_overhead_eats_the_gain():
    # every launch costs 25 of the 60 time units: the measured T_o = 25 makes (T_n - T_o) s(a') > T_n s(a) fail
    # (1 -> 2 atoms needs T_n > 50, but the first results arrive at t >= 26), though atoms are free
    free_when_continuing = []

    class Watched(HyperSched):
        def on_result(self, trial, report):
            decision = super().on_result(trial, report)
            if decision == Decision.CONTINUE and trial.iterations_since_launch > self.cooldown:
                free_when_continuing.append(self.experiment.free_atoms)
            return decision

    result = run_experiment(Watched(min_iterations=2, eta=2, scaling="LINEAR", cooldown=3),
                            SimulatedExecutor(SyntheticWorkload("LINEAR", step_s=1.0), startup_s=25.0),
                            synthetic_search_space(1), total_atoms=4, max_iterations=200, deadline=60)
    assert max(free_when_continuing) > 0
    assert sum(t.resizes for t in result.trials) == 0
    assert all(set(t.iteration_atoms) <= {1} for t in result.trials)


def test_hypersched_beats_asha_on_a_short_deadline():
    def best(scheduler):
        return run_experiment(scheduler, SimulatedExecutor(SyntheticWorkload("LINEAR")), synthetic_search_space(0),
                              total_atoms=8, max_iterations=500, deadline=15).best_metric

    assert best(HyperSched(5, 4, scaling="LINEAR")) > best(ASHA(5, 4))


# --- POP, Bandit, EarlyTerm ----------------------------------------------------------------

def test_promising_slots_desired_vs_deserved():
    # S = 5: p=0.9 -> min(1, 4.5) = 1; p=0.6 -> min(2, 3) = 2; p=0.3 -> min(3, 1.5); p=0.1 -> min(4, 0.5)
    assert promising_slots([0.3, 0.9, 0.1, 0.6], 5) == (2, 0.6)
    # k = 2 slots per job, S = 8: 0.8 -> min(2, 6.4); 0.7 -> min(4, 5.6) = 4; 0.2 -> min(6, 1.6)
    assert promising_slots([0.8, 0.7, 0.2], 8, 2) == (4, 0.7)
    # ties count together: two jobs at 0.5 -> min(2, 2.5) = 2
    assert promising_slots([0.5, 0.5], 5) == (2, 0.5)
    assert promising_slots([0.01, 0.02], 5) == (0, math.inf)
    assert promising_slots([], 5) == (0, math.inf)


def test_confidence_and_expected_remaining_time():
    # p_m = 0.1, 0.2, 0.3: p = 0.6, x = 0.1 + 0.4 + 0.9 = 1.4 epochs, ERT = 2.8 s at 2 s per epoch
    p, ert = confidence_and_ert([0.1, 0.3, 0.6], epoch_s=2.0, time_left=100.0)
    assert p == pytest.approx(0.6) and ert == pytest.approx(2.8)
    # stop summing once ERT passes T_max - T_pass = 2: the third term would make it 2.8
    p, ert = confidence_and_ert([0.1, 0.3, 0.6], epoch_s=2.0, time_left=2.0)
    assert p == pytest.approx(0.3) and ert == 2.0
    # a predicted dip is clipped: cumulative 0.5, 0.5, 0.6
    p, ert = confidence_and_ert([0.5, 0.4, 0.6], epoch_s=1.0, time_left=100.0)
    assert p == pytest.approx(0.6) and ert == pytest.approx(0.5 + 3 * 0.1)


def curves_workload():
    """Epoch times 1 s; 12 epochs. 0: reaches 0.9 at epoch 8; 1: stuck at random accuracy;
    2: slow learner; 3, 4: flat mediocre; 5: fast and good."""
    curves = [
        [0.2 + 0.1 * e for e in range(12)],
        [0.1] * 12,
        [0.3 + 0.01 * e for e in range(12)],
        [0.5] * 12,
        [0.45] * 12,
        [0.4 + 0.06 * e for e in range(12)],
    ]
    return TraceWorkload([Curve(tuple(min(c, 0.99) for c in cur), (1.0,) * 12) for cur in curves])


def test_pop_classifies_promising_opportunistic_and_poor():
    pop = POP(0.9, max_time=30, boundary=2, kill_threshold=0.15, forecaster=fake_forecaster)
    wl = curves_workload()
    result = run_experiment(pop, SimulatedExecutor(wl), wl.configs(range(6)), total_atoms=2, max_iterations=12,
                            target=0.9)
    # trial 0 (0.3 at epoch 2, +0.1 per epoch) is confidently on its way: min(1 job, 2 slots * p) = 1 promising
    # slot; it keeps running without a pause and reaches 0.9 at epoch 8
    assert result.end_reason == "target" and result.best_trial_id == 0 and result.time_to_target == 8.0
    assert result.trials[0].launches == 1 and result.trials[0].iteration == 8
    # the other slot is opportunistic: below the kill threshold at the first boundary, or p < 0.05
    assert "kill threshold at epoch 2" in pop.killed[1]
    assert "confidence" in pop.killed[2] and "confidence" in pop.killed[3]
    assert [t.iteration for t in result.trials[1:5]] == [2, 2, 2, 1]
    assert [t.reported_at[0] for t in result.trials[1:5]] == [1, 3, 5, 7]


def test_pop_suspends_opportunistic_jobs_and_starts_new_ones():
    # one slot: S_deserved = 1 * p < 1 slot unless p = 1, so no job is promising and each is suspended at its
    # boundary (p ~ 0.89 >= 0.05: not poor); HyperDrive's job order (4.2)
    pop = POP(0.75, max_time=100, boundary=2, forecaster=fake_forecaster, resume="fifo")
    wl = TraceWorkload([Curve((0.5, 0.6, 0.7, 0.8), (1.0,) * 4)] * 3)
    result = run_experiment(pop, SimulatedExecutor(wl), wl.configs(range(3)), total_atoms=1, max_iterations=4)
    # new jobs first (0, 1, 2 for b epochs each), then the suspended ones round robin in suspension order
    assert report_order(result) == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2),
                                    (0, 3), (0, 4), (1, 3), (1, 4), (2, 3), (2, 4)]
    assert all(t.state == TrialState.COMPLETED and t.launches == 2 for t in result.trials)


def test_pop_resumes_a_suspended_job_more_confident_than_a_new_configuration_can_expect():
    # one slot, no job promising (1 * p < 1): trial 0 climbs (p high at epoch 2), trials 1-3 are flat at 0.5
    # (p small but >= 0.05), so the mean first-boundary confidence is well below trial 0's
    climbing = Curve((0.5, 0.6, 0.7, 0.8, 0.9, 0.95), (1.0,) * 6)
    flat = Curve((0.5, 0.5, 0.5, 0.5, 0.5, 0.5), (1.0,) * 6)
    wl = TraceWorkload([flat, climbing, flat, flat])

    def run(resume):
        pop = POP(0.75, max_time=100, boundary=2, forecaster=fake_forecaster, min_confidence=0.0, resume=resume)
        result = run_experiment(pop, SimulatedExecutor(wl), wl.configs(range(4)), total_atoms=1, max_iterations=6,
                                target=0.75)
        return pop, result

    pop, result = run("confidence")
    # 0 (flat) then 1 (climbing) to their boundary; 1 is the most confident suspended job and beats the mean
    # first-boundary confidence, so it resumes before 2 and 3 start, and reaches 0.8 at its epoch 4
    assert report_order(result) == [(0, 1), (0, 2), (1, 1), (1, 2), (1, 3), (1, 4)]
    assert result.end_reason == "target" and result.time_to_target == 6.0
    assert pop.confidence[0] < pop.fresh_confidence() < 1.0 and len(pop.first_confidences) == 2
    _, fifo = run("fifo")  # HyperDrive's order: every new configuration first
    assert report_order(fifo)[:8] == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 1), (2, 2), (3, 1), (3, 2)]
    assert fifo.time_to_target == 12.0  # after 0, 1, 2, 3 to epoch 2 and 0 to epoch 4
    with pytest.raises(ProblemError, match="`resume` is 'lifo'"):
        POP(0.75, resume="lifo")


def resumed_from(result):
    """What `thrifty tune --resume` reads back from a run's record: its trials (each with its whole history)
    and every result in arrival order."""
    trials, reports = [], []
    for t in result.trials:
        copy = Trial(t.trial_id, dict(t.config), state=t.state, created_at=t.created_at, ended_at=t.ended_at,
                     checkpoint=t.checkpoint)
        for i, metric in enumerate(t.metrics):
            report = Report(t.trial_id, i + 1, metric, t.iteration_s[i], t.iteration_atoms[i], t.reported_at[i])
            record_result(copy, report)
            reports.append(report)
        trials.append(copy)
    reports.sort(key=lambda r: (r.at, r.trial_id, r.iteration))
    return Resumed(trials, reports, result.ended_at)


class Witness(FIFO):
    """FIFO that notes, at every result, the reporting trial's iterations, every trial's iterations and the
    experiment's clock."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_result(self, trial, report):
        others = {t.trial_id: t.iteration for t in self.experiment.trials.values() if t.iteration}
        self.seen.append((trial.trial_id, report.iteration, trial.iteration, others, self.experiment.now()))
        return super().on_result(trial, report)


def test_a_resumed_experiment_replays_each_result_as_the_scheduler_saw_it_then():
    # the scheduler that replays a record sees every trial's history up to that result, at that result's time,
    # not the histories the record ends with at the time of the restart
    wl = curves_workload()
    first = Witness()
    before = run_experiment(first, SimulatedExecutor(wl), wl.configs([5, 1, 2]), total_atoms=2, max_iterations=4,
                            deadline=5.5)
    assert before.end_reason == "deadline" and before.results == len(first.seen)
    again = Witness()
    after = run_experiment(again, SimulatedExecutor(wl), wl.configs([5, 1, 2]), total_atoms=2, max_iterations=4,
                           deadline=5.5, resume=resumed_from(before))
    assert after.results == before.results
    offset = -before.ended_at  # the resumed experiment started that long before its clock's zero
    assert [s[:4] for s in again.seen] == [s[:4] for s in first.seen]
    assert [s[1] for s in again.seen] == [s[2] for s in again.seen]  # the trial as it stood at that result
    assert again.seen[-1][4] - again.seen[0][4] == pytest.approx(first.seen[-1][4] - first.seen[0][4])
    assert again.seen[0][4] == pytest.approx(first.seen[0][4] + offset)


def test_pop_resumed_keeps_the_confidences_it_had():
    # a driver restarted with --resume rebuilds POP by replaying the record: the first-boundary confidences (what
    # a new configuration can expect) and the suspended jobs' confidences are those of the run, forecast from the
    # curves as they stood at each boundary, with the time that was left then (max_time 7: the horizon shrinks)
    climbing = Curve((0.5, 0.6, 0.7, 0.8, 0.9, 0.95), (1.0,) * 6)
    flat = Curve((0.5, 0.5, 0.5, 0.5, 0.5, 0.5), (1.0,) * 6)
    wl = TraceWorkload([flat, climbing, flat, flat])
    seen = []

    def forecaster(epochs, values, max_epoch, *, seed=0):
        seen.append(len(values))
        return fake_forecaster(epochs, values, max_epoch, seed=seed)

    def pop():
        return POP(0.99, max_time=7, boundary=2, forecaster=forecaster, min_confidence=0.0)

    first = pop()
    before = run_experiment(first, SimulatedExecutor(wl), wl.configs(range(4)), total_atoms=1, max_iterations=6,
                            deadline=5.5)
    assert before.end_reason == "deadline" and len(first.first_confidences) >= 2
    during, seen[:] = list(seen), []
    again = pop()
    run_experiment(again, SimulatedExecutor(wl), wl.configs(range(4)), total_atoms=1, max_iterations=6,
                   deadline=5.5, resume=resumed_from(before))
    assert seen == during  # the same prefixes forecast, in the same order
    assert again.first_confidences == pytest.approx(first.first_confidences)
    assert again.confidence == pytest.approx(first.confidence)
    assert again.fresh_confidence() == pytest.approx(first.fresh_confidence())


def test_bandit_action_elimination():
    assert action_elimination_continues(0.6, 0.85, 0.5)        # 0.9 > 0.85
    assert not action_elimination_continues(0.5, 0.8, 0.5)     # 0.75 < 0.8
    wl = curves_workload()
    result = run_experiment(Bandit(boundary=2), SimulatedExecutor(wl), wl.configs([5, 1, 2]), total_atoms=3,
                            max_iterations=12)
    # epoch 2: global best 0.46; 0.1 * 1.5 < 0.46 stops, 0.31 * 1.5 = 0.465 goes on;
    # epoch 4: global best 0.58 > 0.33 * 1.5 = 0.495 stops
    assert [t.iteration for t in result.trials] == [12, 2, 4]
    assert [t.state for t in result.trials] == [TrialState.COMPLETED, TrialState.TERMINATED, TrialState.TERMINATED]


class Shifted:
    """`inner`'s workload with every score moved by `shift` (below 0: a loss as -loss, a negative reward)."""

    def __init__(self, inner, shift):
        self.inner, self.shift = inner, shift

    def metric(self, config, iteration):
        return self.inner.metric(config, iteration) + self.shift

    def iteration_s(self, config, iteration, atoms):
        return self.inner.iteration_s(config, iteration, atoms)


def shift_free_forecaster(epochs, values, max_epoch, *, seed=0, lower=None, upper=None):
    """`FakeForecast` without its clamp at 1: the same forecast for the same curve moved by any constant."""
    forecast = FakeForecast(list(epochs), list(values))
    forecast.mean = lambda epoch: forecast.last + forecast.slope * (epoch - forecast.n)
    return forecast


@pytest.mark.parametrize("shift", [-100.0, -0.95])
@pytest.mark.parametrize("name", ["fifo", "asha", "hypersched", "pop", "bandit", "earlyterm"])
def test_every_scheduler_decides_the_same_whatever_the_sign_of_the_scores(name, shift):
    # the same curves moved below 0 (with the metric's range, the target and the kill threshold moved alike)
    # give the same run: no rule of any scheduler depends on where 0 is
    def scheduler(d):
        return {"fifo": lambda: FIFO(), "asha": lambda: ASHA(1, eta=2),
                "hypersched": lambda: HyperSched(1, eta=2, deadline=100, cooldown=1),
                "pop": lambda: POP(0.75 + d, max_time=40, boundary=2, kill_threshold=0.15 + d, min_confidence=0.05,
                                   forecaster=shift_free_forecaster, metric_range=(d, 1 + d)),
                "bandit": lambda: Bandit(boundary=2, lower=d),
                "earlyterm": lambda: EarlyTerm(boundary=2, forecaster=shift_free_forecaster,
                                               metric_range=(d, 1 + d))}[name]()

    def run(d):
        wl = curves_workload()
        result = run_experiment(scheduler(d), SimulatedExecutor(Shifted(wl, d)), wl.configs([5, 1, 2, 0, 3, 4]),
                                total_atoms=2, max_iterations=12, deadline=100)
        return report_order(result), [t.state for t in result.trials], [t.atoms for t in result.trials]

    assert run(shift) == run(0.0)


def test_earlyterm_terminates_curves_that_cannot_reach_the_best():
    wl = curves_workload()
    memo = Memoized(fake_forecaster)
    result = run_experiment(EarlyTerm(boundary=3, forecaster=memo), SimulatedExecutor(wl), wl.configs([5, 3, 0]),
                            total_atoms=3, max_iterations=12)
    # flat 0.5: at epoch 3 the best of the others is 0.52, P(y_12 >= 0.52) = 0.43 with sd 0.11; at epoch 6 it is
    # 0.70, P = 0.006 < 0.05; trial 2 (+0.1 per epoch) is predicted to pass any of them
    assert result.trials[1].state == TrialState.TERMINATED and result.trials[1].iteration == 6
    assert result.trials[0].state == TrialState.COMPLETED and result.trials[2].state == TrialState.COMPLETED
    assert memo.calls >= memo.misses > 0


def test_memoized_forecaster_reuses_answers():
    memo = Memoized(fake_forecaster)
    a = memo([1, 2], [0.1, 0.2], 10)
    b = memo([1, 2], [0.1, 0.2], 10)
    memo([1, 2], [0.1, 0.3], 10)
    assert a is b and memo.calls == 3 and memo.misses == 2


# --- executor, workloads, search spaces -----------------------------------------------------

def test_synthetic_score_and_scaling():
    # k = 0, b = (0, 0, 0): (2 - 1 / 0.5) / 2 = 0;  k = 100, b0 = 1, b1 = 1, b2 = 0: (2 - 1/1.6) / 2
    assert synthetic_score(0, 0, 0, 0) == 0.0
    assert synthetic_score(100, 1, 1, 0) == pytest.approx((2 - 1 / 1.6) / 2)
    assert SyntheticWorkload("LINEAR").iteration_s({}, 1, 4) == pytest.approx(0.025)
    assert SyntheticWorkload("SQRT").iteration_s({}, 1, 4) == pytest.approx(0.05)
    assert SyntheticWorkload("NONE").iteration_s({}, 1, 4) == pytest.approx(0.1)


def test_trace_replay_time_to_target_hand_computed():
    # Default on 2 machines: A (1 s epochs) and B (2 s) start at 0; B reaches 0.9 at its epoch 2, t = 4;
    # C would start when A finishes at t = 3 and reach 0.95 only at t = 6
    wl = TraceWorkload([Curve((0.1, 0.2, 0.3), (1, 1, 1)), Curve((0.5, 0.9, 0.95), (2, 2, 2)),
                        Curve((0.3, 0.4, 0.95), (1, 1, 1))])
    result = run_experiment(FIFO(), SimulatedExecutor(wl), wl.configs([0, 1, 2]), total_atoms=2, max_iterations=3,
                            target=0.9)
    assert result.time_to_target == pytest.approx(4.0) and result.end_reason == "target"
    # C started at t = 3; its first epoch ends at t = 4 too, but B's result was due first (ties are FIFO)
    assert result.trials[2].iteration == 0 and result.trials[2].state == TrialState.TERMINATED


def test_startup_overhead_is_paid_and_measured():
    result = run_experiment(FIFO(), SimulatedExecutor(ConstantWorkload(step_s=1.0), startup_s=0.5), configs(0.3),
                            total_atoms=1, max_iterations=3)
    trial = result.trials[0]
    assert trial.reported_at == [1.5, 2.5, 3.5] and trial.overheads_s == [0.5]


def test_configuration_orders_are_seeded_permutations():
    orders = configuration_orders(6, 4, seed=1)
    assert orders == configuration_orders(6, 4, seed=1) and len(orders) == 4
    assert all(sorted(o) == list(range(6)) for o in orders) and len({tuple(o) for o in orders}) > 1


def test_search_spaces():
    grid = GridSearch({"lr": [0.1, 0.01], "depth": [1, 2, 3]})
    seen = []
    while grid.has_more():
        seen.append(grid.next_config())
    assert seen[0] == {"lr": 0.1, "depth": 1} and seen[-1] == {"lr": 0.01, "depth": 3} and len(seen) == 6
    assert grid.next_config() is None
    space = {"lr": LogUniform(1e-4, 1e-1), "w": IntUniform(1, 4), "opt": Choice(["sgd", "adam"]),
             "u": Uniform(0, 1), "e": Exponential(0.1), "fixed": 7}
    a, b = RandomSearch(space, seed=5, max_configs=3), RandomSearch(space, seed=5)
    draws = [a.next_config() for _ in range(3)]
    assert draws == [b.next_config() for _ in range(3)] and a.next_config() is None
    assert all(1e-4 <= d["lr"] <= 1e-1 and d["w"] in (1, 2, 3, 4) and d["fixed"] == 7 for d in draws)
    gen = CallableSearch(lambda i, rng: {"i": i, "x": float(rng.uniform())} if i < 2 else None)
    assert [gen.next_config()["i"], gen.next_config()["i"], gen.next_config()] == [0, 1, None]


def test_running_median_matches_numpy():
    rng = np.random.default_rng(0)
    rm = RunningMedian()
    xs = []
    for x in rng.normal(size=101):
        rm.add(float(x))
        xs.append(float(x))
        assert rm.median() == pytest.approx(float(np.median(xs)))


# --- bad input ------------------------------------------------------------------------------

def test_r_larger_than_R():
    with pytest.raises(ProblemError, match=r"`min_iterations` \(r\) 8 is larger than `max_iterations` \(R\) 4"):
        ASHA(min_iterations=8, eta=2, max_iterations=4)
    with pytest.raises(ProblemError, match="min_iterations"):
        run_experiment(HyperSched(min_iterations=8, eta=2), SimulatedExecutor(ConstantWorkload()), configs(0.1),
                       total_atoms=1, max_iterations=4, deadline=10)


@pytest.mark.parametrize("eta", [1, 0.5, float("nan")])
def test_eta_not_above_one(eta):
    with pytest.raises(ProblemError, match="`eta` is .* but must be greater than 1"):
        HyperSched(min_iterations=1, eta=eta)


@pytest.mark.parametrize("deadline", [0, -5])
def test_deadline_not_positive(deadline):
    with pytest.raises(ProblemError, match="`deadline`"):
        run_experiment(ASHA(), SimulatedExecutor(ConstantWorkload()), configs(0.1), total_atoms=1,
                       max_iterations=4, deadline=deadline)
    with pytest.raises(ProblemError, match="`deadline`"):
        HyperSched(deadline=deadline)


def test_schedulers_that_need_a_deadline_say_so():
    with pytest.raises(ProblemError, match="HyperSched needs a deadline"):
        run_experiment(HyperSched(), SimulatedExecutor(ConstantWorkload()), configs(0.1), total_atoms=1,
                       max_iterations=4)
    with pytest.raises(ProblemError, match="POP needs the maximum experiment time"):
        run_experiment(POP(0.9, forecaster=fake_forecaster), SimulatedExecutor(ConstantWorkload()), configs(0.1),
                       total_atoms=1, max_iterations=4)


@pytest.mark.parametrize("make", [
    lambda: RandomSearch({}),
    lambda: GridSearch({"lr": []}),
    lambda: ConfigList([]),
])
def test_empty_search_space(make):
    with pytest.raises(ProblemError, match="empty"):
        make()


def test_generator_that_yields_nothing():
    with pytest.raises(ProblemError, match="search space is empty"):
        run_experiment(FIFO(), SimulatedExecutor(ConstantWorkload()), CallableSearch(lambda i, rng: None),
                       total_atoms=1, max_iterations=4)


def test_nan_metric_fails_only_that_trial():
    result = run_experiment(FIFO(), SimulatedExecutor(ConstantWorkload(nan_at={0.7: 2})), configs(0.5, 0.7, 0.9),
                            total_atoms=2, max_iterations=3)
    states = [t.state for t in result.trials]
    assert states == [TrialState.COMPLETED, TrialState.FAILED, TrialState.COMPLETED]
    assert "reported metric nan at iteration 2" in result.trials[1].error and result.trials[1].iteration == 1


def test_scheduler_asking_for_atoms_that_are_not_free():
    class Greedy(FIFO):
        def choose(self):
            return Start(None, 3)

    with pytest.raises(SchedulerError, match="asked for 3 atoms, but 2 are free"):
        run_experiment(Greedy(), SimulatedExecutor(ConstantWorkload()), configs(0.1), total_atoms=2, max_iterations=2)


def test_atoms_per_trial_larger_than_the_cluster():
    with pytest.raises(ProblemError, match="`atoms_per_trial` 4 is larger"):
        run_experiment(FIFO(atoms_per_trial=4), SimulatedExecutor(ConstantWorkload()), configs(0.1), total_atoms=2,
                       max_iterations=2)


def test_recorded_traces_replay_the_same_curves():
    """HyperDrive 7.1: a live run's curves and timings, recorded and replayed, give the same experiment."""
    pytest.importorskip("thrifty.datasets.curves", reason="needs thrifty.datasets.curves (the Trace type)")
    from thrifty.runtime.tuning import record_traces

    live = run_experiment(FIFO(), SimulatedExecutor(SyntheticWorkload("NONE", step_s=0.5)),
                          synthetic_search_space(2, 4), total_atoms=2, max_iterations=6)
    traces = record_traces(live)
    assert len(traces) == 4 and all(len(t.accuracy) == 6 for t in traces)
    wl = TraceWorkload(traces)
    replay = run_experiment(FIFO(), SimulatedExecutor(wl), wl.configs(range(4)), total_atoms=2, max_iterations=6)
    assert [t.metrics for t in replay.trials] == [t.metrics for t in live.trials]
    assert [t.reported_at for t in replay.trials] == [t.reported_at for t in live.trials]


def test_pop_reads_first_passage_when_the_forecast_offers_it():
    # every single epoch looks hopeless (p = 0.01) but some epoch reaching the target is likely:
    # POP keeps the trial (first passage); without prob_reached_by it terminates it (Eq. 2 as written)
    class Plateau:
        def prob_at_least(self, y, epoch):
            return 0.01

    class NoisyPlateau(Plateau):
        def prob_reached_by(self, y, first, last):
            return np.minimum(1.0, 0.05 * np.arange(1, last - first + 2))

    def run(forecast):
        pop = POP(0.9, max_time=100, boundary=2, forecaster=lambda e, v, m, *, seed=0: forecast)
        wl = TraceWorkload([Curve((0.5,) * 12, (1.0,) * 12)])
        run_experiment(pop, SimulatedExecutor(wl), wl.configs(range(1)), total_atoms=1, max_iterations=12)
        return pop

    assert 0 in run(Plateau()).killed
    assert run(NoisyPlateau()).killed == {}


def test_forecast_trial_passes_a_prior_learned_from_longer_trials():
    """The forecaster gets no prior until MIN_REFERENCES other trials ran to 2n
    epochs; then a TrialPrior from exactly those (not the trial itself, not
    shorter ones), and none at all without learn_prior."""
    from types import SimpleNamespace

    from thrifty.perfmodels.learning_curve import MIN_REFERENCES, CurvePrior
    from thrifty.runtime.tuning.schedulers.forecasting import forecast_trial

    calls = []

    def recording(epochs, values, max_epoch, *, seed=0, prior=None):
        calls.append(prior)
        return FakeForecast(list(epochs), list(values))

    def trial(tid, metrics):
        return SimpleNamespace(trial_id=tid, iteration=len(metrics), metrics=tuple(metrics))

    young = trial(0, [0.3, 0.5, 0.6, 0.7])
    trials = {0: young, 1: trial(1, [0.2] * 3)}
    forecast_trial(recording, young, trials, 20, learn_prior=True)
    assert calls[-1] is None
    for tid in range(2, 2 + MIN_REFERENCES):
        trials[tid] = trial(tid, [0.3 + 0.01 * tid] * 8 + [0.8 + 0.01 * tid] * 4)
    forecast_trial(recording, young, trials, 20, learn_prior=True)
    assert isinstance(calls[-1], CurvePrior) and calls[-1].asymptote is not None
    forecast_trial(recording, young, trials, 20, learn_prior=False)
    assert calls[-1] is None


def test_memoized_forecaster_keys_on_the_prior():
    from thrifty.perfmodels.learning_curve import CurvePrior

    def with_prior(epochs, values, max_epoch, *, seed=0, prior=None):
        return FakeForecast(list(epochs), list(values))

    memo = Memoized(with_prior)
    a = memo([1, 2], [0.1, 0.2], 10, prior=CurvePrior(asymptote=(2.0, 0.5)))
    b = memo([1, 2], [0.1, 0.2], 10, prior=CurvePrior(asymptote=(2.0, 0.5)))
    c = memo([1, 2], [0.1, 0.2], 10, prior=CurvePrior(asymptote=(2.5, 0.5)))
    assert a is b and a is not c and memo.misses == 2


# --- the metric's range (a loss, a reward: not every metric is an accuracy in [0, 1]) -------

class DecayingLoss:
    """Config {"q": q} reports the score -(0.2 + q / k) at iteration k: a loss that falls towards 0.2."""

    def metric(self, config, iteration):
        return -(0.2 + config["q"] / iteration)

    def iteration_s(self, config, iteration, atoms):
        return 1.0 / atoms


@pytest.mark.parametrize("make", [
    lambda: POP(0.9, max_time=100, boundary=2),
    lambda: EarlyTerm(boundary=2),
])
def test_a_metric_outside_the_forecasters_range_is_a_clear_error_at_its_first_report(make):
    # the real forecaster fits within [0, 1] by default; a loss seen as -loss is outside it
    executor = SimulatedExecutor(DecayingLoss())
    with pytest.raises(ProblemError, match=r"trial 0 reported -1\.2 .* at iteration 1, outside the metric's "
                                           r"range \[0, 1\] .* metric_range") as info:
        run_experiment(make(), executor, configs(1.0, 0.5), total_atoms=1, max_iterations=12)
    assert info.value.path == "metric_range"


def test_pop_and_earlyterm_forecast_a_loss_within_its_range():
    # as the schedulers see a loss: -loss, bounded above by 0 (the real forecaster warps by that headroom)
    qs = (3.0, 2.0, 1.5, 0.6, 0.4)
    pop = POP(-0.25, max_time=80, boundary=4, metric_range=(None, 0.0), resume="fifo")
    result = run_experiment(pop, SimulatedExecutor(DecayingLoss()), configs(*qs), total_atoms=2, max_iterations=16,
                            target=-0.25)
    winner = result.trials[4]
    assert winner.metrics[-1] >= -0.25 and winner.iteration == 8  # q = 0.4: a loss of 0.25 at iteration 8
    paused = pop.confidence  # the slow three, suspended at epoch 4: the slower, the less confident
    assert set(paused) == {0, 1, 2} and paused[0] < paused[1] < paused[2] < 0.5
    early = EarlyTerm(boundary=4, metric_range=(None, 0.0))
    result = run_experiment(early, SimulatedExecutor(DecayingLoss()), configs(*qs), total_atoms=2, max_iterations=12)
    assert all(t.state in (TrialState.COMPLETED, TrialState.TERMINATED) for t in result.trials)


def test_the_forecaster_hears_of_the_range_only_when_it_is_not_the_default():
    from types import SimpleNamespace

    from thrifty.runtime.tuning.schedulers.forecasting import forecast_trial

    seen = []

    def recording(epochs, values, max_epoch, *, seed=0, **bounds):
        seen.append(bounds)
        return FakeForecast(list(epochs), list(values))

    trial = SimpleNamespace(trial_id=0, iteration=2, metrics=(-3.0, -2.0))
    forecast_trial(recording, trial, {0: trial}, 10, learn_prior=False, metric_range=(None, 0.0))
    forecast_trial(recording, trial, {0: trial}, 10, learn_prior=True, metric_range=(None, None))
    forecast_trial(recording, trial, {0: trial}, 10, learn_prior=False)
    assert seen == [{"lower": None, "upper": 0.0}, {"lower": None, "upper": None}, {}]
    memo = Memoized(recording)
    assert memo([1], [-2.0], 5, upper=0.0, lower=None) is not memo([1], [-2.0], 5)


@pytest.mark.parametrize("bad, path", [
    ((1.0, 0.0), "metric_range"), ((0.0, 0.0), "metric_range"), ((float("nan"), 1.0), r"metric_range\[0\]"),
    ((0.0, "1"), r"metric_range\[1\]"), ((0.0,), "metric_range"), ("0-1", "metric_range"),
])
def test_bad_metric_ranges(bad, path):
    for make in (lambda: POP(0.5, metric_range=bad), lambda: EarlyTerm(metric_range=bad)):
        with pytest.raises(ProblemError, match=path):
            make()


def test_a_pop_target_outside_the_metric_range_cannot_be_reached():
    with pytest.raises(ProblemError, match=r"`target` is 5\.0, outside metric_range \[0, 1\]"):
        POP(5.0)
    assert POP(5.0, metric_range=(None, None)).target == 5.0
