"""Executors of the tuning runtime: the world executor with real torch worker
processes (gloo on 127.0.0.1, real checkpoints, pause/resume and resize), and
the plan executor on the simulated backend and on real processes."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from thrifty.core.errors import ProblemError
from thrifty.runtime.providers.base import billed_cost_usd
from thrifty.runtime.providers.local import LocalProvider
from thrifty.runtime.ddp.trainer import Trainer
from thrifty.runtime.tuning import (ASHA, FIFO, ConfigList, Decision, HyperSched, Scheduler, Start, TrialState,
                                    run_experiment, synthetic_search_space)
from thrifty.runtime.tuning.executors.worlds import WorldExecutor, TunableTrainer, example_trainer
from thrifty.runtime.tuning.executors.plan import execute_plan, simulated_backend
from thrifty.solver.problem import parse_problem
from thrifty.solver.solve import solve_tuning

torch = pytest.importorskip("torch")

EXAMPLE = "thrifty.runtime.tuning.executors.worlds:example_trainer"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def assert_reaped(executor: WorldExecutor) -> None:
    pids = [pid for record in executor.launches for pid in record.pids]
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)], "worker processes outlived their trial"


# --- trainers the tests launch (worker processes import them by name) ---------------------------

def faulty_trainer(mode: str = "ok", lr: float = 0.3) -> Trainer:
    """example_trainer, broken as `mode` says: raise in model(), report NaN,
    return a plain Trainer (no metric), or hang in the second iteration."""
    base = example_trainer(lr=lr, samples=256)
    if mode == "raise":
        def model():
            raise RuntimeError("boom in model()")

        return TunableTrainer(model=model, optimizer=base.optimizer, dataset=base.dataset, loss=base.loss,
                              metric=base.metric)
    if mode == "nan":
        return TunableTrainer(model=base.model, optimizer=base.optimizer, dataset=base.dataset, loss=base.loss,
                              metric=lambda m: math.nan)
    if mode == "plain":
        return Trainer(model=base.model, optimizer=base.optimizer, dataset=base.dataset, loss=base.loss)
    if mode == "hang":
        calls = []

        def metric(m):
            calls.append(1)
            if len(calls) >= 2:
                time.sleep(120)
            return base.metric(m)

        return TunableTrainer(model=base.model, optimizer=base.optimizer, dataset=base.dataset, loss=base.loss,
                              metric=metric)
    return base


class Scripted(Scheduler):
    """Trial 0 pauses after iteration 1; trial 1 then starts on 1 atom and grows
    to 2 after its first iteration; when it completes, trial 0 resumes on 2
    atoms; then trial 2 (trial 0's configuration) runs straight on 1 atom."""

    def choose(self):
        exp = self.experiment
        trials = exp.trials
        running = exp.running_trials()
        if not trials:
            return Start(None, 1)
        if len(trials) == 1 and trials[0].state == TrialState.PAUSED:
            return Start(None, 1)
        if trials[0].state == TrialState.PAUSED and exp.free_atoms == 2:
            return Start(0, 2)
        if trials[0].state == TrialState.COMPLETED and not running and exp.has_more_configs():
            return Start(None, 1)
        return None

    def on_result(self, trial, report):
        if trial.trial_id == 0 and report.iteration == 1 and trial.launches == 1:
            return Decision.PAUSE
        return Decision.CONTINUE

    def target_atoms(self, trial):
        return 2 if trial.trial_id == 1 and trial.iteration == 1 else trial.atoms


# the trainer, and the same model and data as a loop function (the job contract: its own state checkpointed)
@pytest.mark.parametrize("trainer", [EXAMPLE, "thrifty.runtime.tuning.executors.worlds:example_loop"])
def test_pause_resume_and_resize_continue_the_same_training(tmp_path, trainer):
    a, b = {"lr": 0.3, "hidden": 16}, {"lr": 0.05, "hidden": 8}
    with WorldExecutor(trainer, tmp_path, start_timeout_s=90, iteration_timeout_s=60, metric="accuracy") as executor:
        result = run_experiment(Scripted(), executor, ConfigList([a, b, a]), total_atoms=2, max_iterations=4)
    assert_reaped(executor)
    t0, t1, t2 = result.trials
    assert [t.state for t in result.trials] == [TrialState.COMPLETED] * 3
    # trial 0: paused after 1 iteration on 1 atom, resumed from its checkpoint on 2 atoms
    assert t0.iteration_atoms == [1, 2, 2, 2] and t0.launches == 2
    assert t1.iteration_atoms == [1, 2, 2, 2] and t1.resizes == 1
    records = {(r.trial_id, r.from_iteration): r for r in executor.launches}
    assert records[(0, 1)].atoms == 2 and records[(0, 1)].save_s > 0 and records[(0, 1)].restore_s > 0
    assert records[(1, 1)].atoms == 2 and records[(1, 1)].save_s > 0
    assert all(r.ended == "suspended" for key, r in records.items() if key in ((0, 0), (1, 0)))
    # overheads measured and given to the loop: one per launch, the restore ones include the checkpoint
    assert len(t0.overheads_s) == 2 and all(o > 0 for o in t0.overheads_s)
    assert t0.overheads_s[1] == pytest.approx(records[(0, 1)].overhead_s)
    # pausing, resuming on another world size and restoring did not change the training:
    # trial 2 trains the same configuration without interruption on one rank
    assert t0.metrics == pytest.approx(t2.metrics, abs=2 / 512)
    assert t2.metrics[-1] > 0.5  # it learns (4 classes: chance is 0.25)
    assert (tmp_path / "trial-0" / "checkpoint.pt").exists()


def test_hypersched_grows_the_surviving_trial_on_two_atoms(tmp_path):
    # the worse trial pauses at the first rung (speculative evaluation); no configuration is
    # left, so the survivor gets the free atom once its cooldown has passed (HyperSched 4.3); the
    # paper's rules verbatim, so the paused trial does not resume on the atoms freed at the end
    configs = ConfigList([{"lr": 0.3, "samples": 2048}, {"lr": 0.002, "hidden": 4, "samples": 2048}])
    scheduler = HyperSched(min_iterations=1, eta=2, max_iterations=12, scaling="LINEAR", cooldown=1,
                           use_idle_atoms=False)
    with WorldExecutor(EXAMPLE, tmp_path, start_timeout_s=90, iteration_timeout_s=60) as executor:
        result = run_experiment(scheduler, executor, configs, total_atoms=2, max_iterations=12, deadline=120)
    assert_reaped(executor)
    best, worse = result.trials
    assert result.end_reason == "exhausted" and not result.failed
    assert best.state == TrialState.COMPLETED and best.iteration == 12 and best.last_metric > 0.6
    assert worse.state == TrialState.PAUSED and worse.iteration < best.iteration and worse.launches == 1
    assert best.resizes == 1 and best.iteration_atoms[-1] == 2 and best.iteration_atoms[0] == 1
    grown = [r for r in executor.launches if r.trial_id == 0 and r.from_iteration > 0]
    assert len(grown) == 1 and grown[0].atoms == 2 and len(grown[0].pids) == 2
    # the measured overheads reached the scheduler (HyperSched's T_o)
    assert all(o > 0 for t in result.trials for o in t.overheads_s)
    assert best.overheads_s[1] == pytest.approx(grown[0].overhead_s)
    assert scheduler.overhead_s() > 0


def test_asha_pauses_and_promotes_with_real_processes(tmp_path):
    # one atom: one trial at a time, so the order of results is fixed
    configs = ConfigList([{"lr": 0.3}, {"lr": 0.01, "hidden": 4}, {"lr": 0.003, "hidden": 4}])
    with WorldExecutor(EXAMPLE, tmp_path, start_timeout_s=90, iteration_timeout_s=60) as executor:
        result = run_experiment(ASHA(min_iterations=1, eta=2, max_iterations=4), executor, configs,
                                total_atoms=1, max_iterations=4)
    assert_reaped(executor)
    t0, t1, t2 = result.trials
    # ASHA pauses a rung's first arrival; trial 0 is promoted once trial 1 scores lower at rung 1
    assert [r.trial_id for r in executor.launches] == [0, 1, 0, 2]
    assert executor.launches[2].from_iteration == 1 and executor.launches[2].restore_s > 0
    assert (t0.state, t0.iteration) == (TrialState.PAUSED, 2)
    assert (t1.state, t1.iteration, t2.state, t2.iteration) == (TrialState.PAUSED, 1, TrialState.PAUSED, 1)
    assert t0.metrics[0] > t1.metrics[0]


def test_crashing_trials_fail_and_the_experiment_goes_on(tmp_path):
    configs = ConfigList([{"mode": "raise"}, {"mode": "nan"}, {"mode": "plain"}, {"mode": "hang"}, {"mode": "ok"}])
    with WorldExecutor("test_tuning_executors:faulty_trainer", tmp_path, start_timeout_s=90,
                       iteration_timeout_s=3, stop_grace_s=1) as executor:
        result = run_experiment(FIFO(), executor, configs, total_atoms=2, max_iterations=3)
    assert_reaped(executor)
    states = [t.state for t in result.trials]
    assert states == [TrialState.FAILED] * 4 + [TrialState.COMPLETED]
    errors = [t.error for t in result.trials]
    assert "boom in model()" in errors[0]
    assert "nan" in errors[1]
    assert "TunableTrainer" in errors[2]
    assert "no result within 3 s" in errors[3]
    assert result.trials[4].iteration == 3 and result.best_trial_id == 4


def test_bad_executor_settings_name_the_field(tmp_path):
    with pytest.raises(ProblemError, match="iteration_timeout_s"):
        WorldExecutor(EXAMPLE, tmp_path, iteration_timeout_s=0)
    with pytest.raises(ProblemError, match="threads"):
        WorldExecutor(EXAMPLE, tmp_path, threads=0)
    with pytest.raises(ProblemError, match="module-level function"):
        WorldExecutor(lambda **c: None, tmp_path)


# --- the plan executor -------------------------------------------------------------------------


DEMO_CATALOG = str(Path(__file__).resolve().parent.parent / "datasets" / "examples" / "local-demo-catalog.json")


def sha_problem(**changes):
    data = {"kind": "tuning", "experiment": {"algorithm": "sha", "trials": 8, "min_iters": 1, "max_iters": 7, "eta": 2},
            "model": "resnet50", "instance_type": "p3.8xlarge", "deadline_s": 60, "billing": "per_instance",
            "cloud": {"scale_latency_s": 5, "init_latency_s": 10, "init_latency_sd_s": 2}, "samples": 60,
            "name": "sha8"}
    data.update(changes)
    return parse_problem(data)


def check_placements(record, gpus_per_instance):
    for snapshot in record.placements:
        used = {}
        for where in snapshot.values():
            assert sum(where.values()) == record.gpus_per_trial
            for node, gpus in where.items():
                assert node in record.machines
                used[node] = used.get(node, 0) + gpus
        assert all(u <= gpus_per_instance for u in used.values())


def check_costs(result, min_billed_s=60.0):
    billed = sum(billed_cost_usd(m.price_per_hour, m.terminated_at - m.launched_at, min_billed_s)
                 for m in result.machines)
    assert result.cost_usd == pytest.approx(billed)
    # the stages' costs are the machines' seconds within each stage, which never exceed their lifetimes
    unbilled = sum(m.price_per_hour * (m.terminated_at - m.launched_at) / 3600 for m in result.machines)
    assert sum(s.cost_usd for s in result.stages) <= unbilled * (1 + 1e-9) <= result.cost_usd * (1 + 1e-9)
    assert all(m.terminated_at is not None for m in result.machines)


def test_sha_plan_runs_stage_by_stage_on_the_simulated_backend():
    problem = sha_problem()
    plan = solve_tuning(problem)
    assert plan.feasible
    backend = simulated_backend(problem, seed=1)
    result = backend.execute(plan, synthetic_search_space(seed=3))
    assert [len(s.trial_ids) for s in result.stages] == [s.trials for s in plan.stages] == [8, 4, 2]
    assert len(result.trials) == 8
    done = 0
    for k, (record, stage) in enumerate(zip(result.stages, plan.stages)):
        assert record.index == k and len(record.machines) == stage.instances
        assert record.gpus_per_trial == stage.gpus_per_trial
        done += stage.iters_per_trial
        # every trial of the stage trained exactly to the stage's end, on its GPUs per trial
        for tid in record.trial_ids:
            trial = result.trials[tid]
            assert trial.iteration >= done and trial.iteration_atoms[done - 1] == stage.gpus_per_trial
        check_placements(record, 4)
        if k:
            before = result.stages[k - 1]
            assert before.ended_at <= record.started_at
            assert set(record.trial_ids) | set(record.dropped) == set(before.trial_ids)
            # SHA keeps the best: every kept trial scored at least as well as every dropped one
            score = {t: result.trials[t].metrics[done - stage.iters_per_trial - 1] for t in before.trial_ids}
            assert min(score[t] for t in record.trial_ids) >= max(score[t] for t in record.dropped)
    last = result.stages[-1]
    assert [t.state for t in result.trials].count(TrialState.COMPLETED) == len(last.trial_ids)
    assert result.trials[result.best_trial_id].iteration == 7
    assert backend.provider.machines() == []
    check_costs(result)
    # the run agrees with the plan's prediction (same models, other random draws)
    assert result.jct_s == pytest.approx(plan.predicted.jct_s, rel=0.1)
    assert result.cost_usd == pytest.approx(plan.predicted.cost_usd, rel=0.15)
    for record in result.stages:
        assert record.actual_s == pytest.approx(record.predicted_s, rel=0.2)
    assert "total" in result.table()


def test_a_plan_that_changes_types_resizes_queues_and_starts_a_bracket():
    problem = sha_problem(instance_type=["p3.2xlarge", "p3.8xlarge"])
    def stage(n, iters, itype, inst, g):
        return {"trials": n, "iters_per_trial": iters, "instance_type": itype, "instances": inst,
                "gpus_per_trial": g, "gpus": inst}
    plan = {"kind": "tuning", "status": "feasible", "billing": "per_instance", "stages": [
        stage(4, 1, "p3.2xlarge", 2, 1),   # 2 slots for 4 trials: two queue
        stage(2, 2, "p3.8xlarge", 1, 2),   # another type: the fleet is replaced; trials grow 1 -> 2
        stage(1, 3, "p3.8xlarge", 2, 8),   # one trial on two whole instances
        stage(3, 2, "p3.8xlarge", 1, 4),   # more trials than before: a new bracket; one instance released
    ]}
    backend = simulated_backend(problem, seed=0)
    result = backend.execute(plan, synthetic_search_space(seed=0))
    s0, s1, s2, s3 = result.stages
    assert s0.queued == 2 and s0.provisioned == 2
    assert s1.released == 2 and s1.provisioned == 1 and sorted(s1.resized) == sorted(s1.trial_ids)
    assert s2.provisioned == 1 and s2.resized == s2.trial_ids
    assert [len(where) for where in s2.placements[0].values()] == [2]  # one trial on two instances
    assert s3.new_bracket and s3.released == 1 and s3.queued == 2 and len(s3.trial_ids) == 3
    assert set(s3.trial_ids).isdisjoint(s0.trial_ids) and len(result.trials) == 7
    for record, g in zip(result.stages, (1, 4, 4, 4)):
        check_placements(record, g)
    winner = result.trials[s2.trial_ids[0]]
    assert winner.state == TrialState.COMPLETED and winner.iteration == 6 and winner.resizes == 2
    assert winner.iteration_atoms == [1, 2, 2, 8, 8, 8]
    check_costs(result)
    assert result.predicted_jct_s is None and s0.predicted_s is None and "total" in result.table()
    assert backend.provider.machines() == []


def test_a_plan_executor_rejects_bad_plans():
    backend = simulated_backend(sha_problem(), seed=0)
    with pytest.raises(ProblemError, match=r"stages\[0\]\.gpus_per_trial"):
        backend.execute({"stages": [{"trials": 2, "iters_per_trial": 1, "instances": 1, "gpus_per_trial": 0,
                                     "instance_type": "p3.8xlarge"}]}, synthetic_search_space(seed=0))
    with pytest.raises(ProblemError, match="infeasible"):
        backend.execute({"status": "infeasible", "stages": []}, synthetic_search_space(seed=0))
    with pytest.raises(ProblemError, match="cannot hold one trial"):
        backend.execute({"stages": [{"trials": 2, "iters_per_trial": 1, "instances": 1, "gpus_per_trial": 8,
                                     "instance_type": "p3.8xlarge"}]}, synthetic_search_space(seed=0))
    assert backend.provider.machines() == []


def test_a_plan_runs_with_real_processes_on_local_machines(tmp_path):
    # a profile for the example trainer (one iteration: 0.5 s on one worker, 0.3 s on two) and a
    # deadline that the planner can only meet with two machines in stage 0 and a trial grown to
    # two workers in stage 1
    profile = tmp_path / "tiny.json"
    profile.write_text(json.dumps({"format": "thrifty.scaling_profile/1", "model": "tiny", "instance_type": "local-a",
                                   "startup_s": 0.1, "points": [{"gpus": 1, "iteration_s": 0.5},
                                                                {"gpus": 2, "iteration_s": 0.3}]}))
    problem = parse_problem({"kind": "tuning", "stages": [{"trials": 3, "iters": 1}, {"trials": 1, "iters": 2}],
                             "model": str(profile), "instance_type": "local-a", "catalog": DEMO_CATALOG,
                             "deadline_s": 2.0, "max_instances": 2, "samples": 20})
    plan = solve_tuning(problem)
    assert [(s.instances, s.gpus_per_trial) for s in plan.stages] == [(2, 1), (2, 2)]
    configs = ConfigList([{"lr": 0.3}, {"lr": 0.003, "hidden": 4}, {"lr": 0.1}])
    with WorldExecutor(EXAMPLE, tmp_path / "run", start_timeout_s=90, iteration_timeout_s=60) as executor, \
            LocalProvider("plan-test", catalog=DEMO_CATALOG) as provider:
        result = execute_plan(plan, executor, provider, configs)
        assert provider.machines() == []
    assert_reaped(executor)
    assert [len(s.trial_ids) for s in result.stages] == [3, 1] and not result.failed
    assert [len(s.machines) for s in result.stages] == [s.instances for s in plan.stages]
    winner = result.trials[result.stages[1].trial_ids[0]]
    assert winner.state == TrialState.COMPLETED and winner.iteration == 3 and winner.launches == 2
    assert winner.config["lr"] != 0.003 and winner.last_metric > 0.5
    relaunch = [r for r in executor.launches if r.trial_id == winner.trial_id][1]
    assert relaunch.from_iteration == 1 and relaunch.atoms == 2 and len(relaunch.pids) == 2
    assert winner.resizes == 1 and winner.iteration_atoms == [1, 2, 2]
    assert result.stages[0].queued == 1 and result.stages[1].resized == [winner.trial_id]
    for record in result.stages:
        check_placements(record, 1)
    check_costs(result)
    assert result.cost_usd > 0 and result.jct_s > 0


# --- machines taken away: the executors read the provider's interruption feed --------------------

class Interrupting:
    """An executor that, once trial `victim` reported `after` results, has the
    local provider take away the machine that trial runs on (a spot notice
    with `time_left_s`, or a loss with 0): the injection goes through
    `LocalProvider.interrupt`, as a cloud's notice would come."""

    def __init__(self, inner, provider, time_left_s, victim=0, after=1):
        self.inner, self.provider, self.time_left_s = inner, provider, time_left_s
        self.victim, self.after = victim, after
        self.clock = inner.clock
        self.where = []  # (trial id, machines) of each launch
        self.taken = None

    def launch(self, trial, atoms, where=None):
        self.inner.launch(trial, atoms, where)  # without `where`, the local executor chose the machines
        self.where.append((trial.trial_id, set(where) if where is not None else set(self.inner.launches[-1].machines)))

    def proceed(self, trial):
        self.inner.proceed(trial)

    def suspend(self, trial):
        return self.inner.suspend(trial)

    def terminate(self, trial):
        self.inner.terminate(trial)

    def next_event(self, until):
        event = self.inner.next_event(until)
        if self.taken is None and event is not None and event.trial_id == self.victim \
                and getattr(event, "iteration", 0) == self.after:
            self.taken = next(iter(next(m for t, m in reversed(self.where) if t == self.victim)))
            self.provider.interrupt(self.taken, time_left_s=self.time_left_s, reason="test: spot")
        return event


def local_plan(instances):
    return {"kind": "tuning", "status": "feasible", "billing": "per_instance", "stages": [
        {"trials": 4, "iters_per_trial": 3, "instance_type": "local-a", "instances": instances, "gpus_per_trial": 1,
         "gpus": instances}]}


def simulated_on_local_machines(tmp_path):
    profile = tmp_path / "tiny.json"
    profile.write_text(json.dumps({"format": "thrifty.scaling_profile/1", "model": "tiny", "instance_type": "local-a",
                                   "startup_s": 0.1, "points": [{"gpus": 1, "iteration_s": 0.5}]}))
    return simulated_backend(parse_problem({
        "kind": "tuning", "stages": [{"trials": 4, "iters": 3}], "model": str(profile), "instance_type": "local-a",
        "catalog": DEMO_CATALOG, "deadline_s": 60.0, "max_instances": 2, "samples": 20}), seed=0)


def interrupted_plan(tmp_path, instances, time_left_s):
    """A one-stage plan of simulated trials on `instances` local machines, the
    machine of trial 0 taken away after its first result; (result, executor)."""
    backend = simulated_on_local_machines(tmp_path)
    with LocalProvider("interrupted", catalog=DEMO_CATALOG) as provider:
        executor = Interrupting(backend.executor, provider, time_left_s=time_left_s)
        result = execute_plan(local_plan(instances), executor, provider, synthetic_search_space(seed=0),
                              stage_hook=backend.stage_hook)
        assert provider.machines() == []
    return result, executor


def test_a_spot_notice_on_the_local_provider_moves_the_trial_to_a_machine_left(tmp_path):
    result, executor = interrupted_plan(tmp_path, 2, time_left_s=120.0)
    stage, taken = result.stages[0], executor.taken
    assert stage.preempted == [taken] and stage.provisioned == 2 and not result.failed
    victim = result.trials[0]  # paused with a checkpoint at its next result, and on from it elsewhere
    assert victim.state == TrialState.COMPLETED and victim.iteration == 3 and victim.launches == 2
    relaunched = [m for t, m in executor.where if t == 0][1]
    assert taken not in relaunched
    after = executor.where[[t for t, _ in executor.where].index(0, 1):]  # launches from the victim's relaunch
    assert all(taken not in machines for _, machines in after)
    assert all(t.iteration == 3 and t.state == TrialState.COMPLETED for t in result.trials)
    gone = next(m for m in result.machines if m.id == taken)
    assert gone.terminated_at < max(m.terminated_at for m in result.machines)  # given back before the end


def test_a_machine_lost_on_the_local_provider_fails_its_trial_and_is_replaced(tmp_path):
    result, executor = interrupted_plan(tmp_path, 1, time_left_s=0.0)
    stage, taken = result.stages[0], executor.taken
    assert stage.preempted == [taken] and stage.provisioned == 2 and len(stage.machines) == 2
    assert list(result.failed) == [0] and taken in result.failed[0] and "test: spot" in result.failed[0]
    assert result.trials[0].iteration == 1
    assert all(t.iteration == 3 and t.state == TrialState.COMPLETED for t in result.trials[1:])
    assert all(taken not in machines for t, machines in executor.where if t != 0)


def test_the_local_executor_fails_the_trials_of_a_lost_machine_and_the_loop_goes_on(tmp_path):
    configs = ConfigList([{"lr": 0.3}, {"lr": 0.1}, {"lr": 0.2}])
    with LocalProvider("lost", catalog=DEMO_CATALOG) as provider, \
            WorldExecutor(EXAMPLE, tmp_path, start_timeout_s=90, iteration_timeout_s=60, provider=provider) as inner:
        provider.provision("local-a", 3, "spot")  # one to spare: the loop's two atoms fit on what is left
        executor = Interrupting(inner, provider, time_left_s=0.0)
        result = run_experiment(FIFO(), executor, configs, total_atoms=2, max_iterations=2)
    assert_reaped(inner)
    taken = executor.taken
    assert [t.state for t in result.trials] == [TrialState.FAILED, TrialState.COMPLETED, TrialState.COMPLETED]
    assert taken in result.trials[0].error and "test: spot" in result.trials[0].error
    assert all(taken not in r.machines for r in inner.launches[1:] if r.trial_id != 0)
