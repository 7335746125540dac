"""The training runtime's parts, in this process: sharding, the progress
monitor against injected transient and persistent slowdowns, re-plan problems,
plan checks, hooks, the run log, faults, the local provider, checkpoints,
trainers and the command line's bad input. (Real worker processes:
test_training_runtime_processes.py.)"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from thrifty.datasets.catalog import load_catalog
from thrifty.core.errors import ProblemError
from thrifty.core.validation import json_object
from thrifty.runtime.events import Preemption
from thrifty.runtime.providers.base import CapacityError, Machine, billed_cost_usd
from thrifty.runtime.providers.local import LocalProvider
from thrifty.runtime.training.errors import ReplanInfeasible
from thrifty.runtime.training.faults import FaultInjector, KillWorker, SlowWorker
from thrifty.runtime.training.hooks import Hooks
from thrifty.runtime.training.launcher import RankSlot
from thrifty.runtime.training.monitor import ProgressMonitor, projected_cost, spent_cost, window_throughput
from thrifty.runtime.training.plans import as_plan, check_plan
from thrifty.runtime.training.replan import Replanner, replan_changes
from thrifty.runtime.training.runlog import RunLog, read_run_log
from thrifty.runtime.ddp.sharding import ShardedStream, rank_offsets, split_batch
from thrifty.solver.problem import parse_problem

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
DEMO_CATALOG = str(ROOT / "datasets" / "examples" / "local-demo-catalog.json")


def demo_problem(**changes) -> dict:
    problem = {"kind": "training", "model": "mlp", "global_batch": 16, "iterations": 60, "objective": "min_cost",
               "catalog": DEMO_CATALOG, "batch_sizes": [4, 8, 16], "respect_threshold": False,
               "instances": [{"instance_type": "local-a", "market": "spot", "quota": 2},
                             {"instance_type": "local-b", "market": "spot", "quota": 2},
                             {"instance_type": "local-b", "market": "on_demand", "quota": 2}]}
    problem.update(changes)
    return problem


def plan_dict(*allocation: tuple[str, str, int, int]) -> dict:
    return {"kind": "training", "status": "optimal", "objective": "min_cost",
            "allocation": [{"instance_type": t, "market": m, "count": c, "batch_per_instance": b}
                           for t, m, c, b in allocation],
            "predicted": {"iteration_s": 0.01, "total_s": 1.0, "cost_usd": 0.01, "total_s_p95": 1.0}}


# -- sharding -------------------------------------------------------------------------

def test_each_sample_once_per_epoch_and_ranks_concatenate_to_the_global_batch():
    batches, n = [3, 5, 8], 40  # 40 samples: epochs end mid-iteration
    streams = [ShardedStream(n, 16, o, b, seed=7) for o, b in zip(rank_offsets(batches), batches)]
    single = ShardedStream(n, 16, 0, 16, seed=7)
    seen = []
    for it in range(10):
        joined = np.concatenate([s.indices(it) for s in streams])
        assert np.array_equal(joined, single.indices(it))
        seen.append(joined)
    stream = np.concatenate(seen)  # 160 positions = 4 epochs
    for epoch in range(4):
        assert sorted(stream[epoch * n:(epoch + 1) * n]) == list(range(n))
    # another world with the same global batch reads the same samples
    other = [ShardedStream(n, 16, o, b, seed=7) for o, b in zip(rank_offsets([8, 8]), [8, 8])]
    assert np.array_equal(np.concatenate([s.indices(3) for s in other]), seen[3])


def test_reweighting_factors():
    pytest.importorskip("torch")
    from thrifty.runtime.ddp.reweight import batch_weight, loss_scale

    batches = [3, 5, 8]
    assert sum(batch_weight(b, 16) for b in batches) == pytest.approx(1.0)
    # DDP averages over W ranks: the scaled means average to the global-batch mean
    assert sum(loss_scale(b, 16, 3) for b in batches) / 3 == pytest.approx(1.0)
    assert loss_scale(8, 16, 2) == 1.0  # equal batches: plain DDP
    with pytest.raises(ValueError):
        batch_weight(0, 16)


def test_split_batch():
    assert split_batch(10, 4) == [3, 3, 2, 2]
    assert split_batch(8, 1) == [8]
    with pytest.raises(ValueError):
        split_batch(2, 4)


# -- the progress monitor --------------------------------------------------------------

NOMINAL_S, TOTAL, TIME_LIMIT = 0.01, 3000, 36.0  # 30 s of work, 20% slack


def run_monitor(durations: np.ndarray, window_s: float = 4.0, bins: int = 8, poll_s: float = 0.05):
    """Feed a monitor the completion times of iterations with the given
    durations, checking at every poll; returns the verdicts."""
    ends = np.cumsum(durations)
    monitor = ProgressMonitor(TOTAL, TIME_LIMIT, None, start=0.0, window_s=window_s, bins=bins)
    verdicts, k = [], 0
    for now in np.arange(poll_s, ends[-1], poll_s):
        while k < len(ends) and ends[k] <= now:
            monitor.observe(float(ends[k]), k + 1)
            k += 1
        verdicts.append((now, monitor.check(now, [])))
    return verdicts


def test_transient_slowdown_never_calls_for_a_replan():
    durations = np.full(TOTAL, NOMINAL_S)
    durations[800:840] = 5 * NOMINAL_S  # 2 s at a fifth of the speed, inside a 4 s window
    verdicts = run_monitor(durations)
    assert not any(v.replan or v.violation for _, v in verdicts)
    # the test has teeth: the mean throughput alone projects a missed deadline during the transient
    assert any(v.projected_total_s is not None and v.projected_total_s > TIME_LIMIT for _, v in verdicts)


def test_persistent_slowdown_calls_for_a_replan_once_certain():
    durations = np.full(TOTAL, NOMINAL_S)
    durations[800:] = 3 * NOMINAL_S  # from 8 s on, a third of the speed: 74 s in all
    verdicts = run_monitor(durations)
    start = float(np.cumsum(durations)[799])
    first = next(now for now, v in verdicts if v.replan)
    assert start < first <= start + 4.0 + 0.5 + 0.1  # within a window and a bin width
    assert not any(v.replan for now, v in verdicts if now < start)
    at = next(v for now, v in verdicts if v.replan)
    assert at.violation == ("time",) and at.optimistic_total_s > TIME_LIMIT
    assert at.window.bound >= at.window.mean > 0


def test_window_throughput_statistics():
    t = np.arange(0, 10.01, 0.5)
    n = 4 * t  # 4 iterations per second, exactly
    w = window_throughput(t, n, end=10.0, span_s=4.0, bins=4)
    assert w.mean == pytest.approx(4.0) and w.sd == pytest.approx(0.0, abs=1e-9) and w.bound == pytest.approx(4.0)
    assert window_throughput(t, n, end=10.0, span_s=20.0, bins=4) is None  # not covered yet


def test_spent_cost_bills_per_second_with_a_minute_minimum():
    running = Machine("m0", "local-a", "spot", "127.0.0.1", launched_at=100.0, price_per_hour=3.6)
    ended = Machine("m1", "local-b", "spot", "127.0.0.1", launched_at=100.0, price_per_hour=3.6,
                    state="terminated", terminated_at=110.0)
    assert spent_cost([running], now=110.0) == pytest.approx(3.6 * 60 / 3600)  # minimum 60 s
    assert spent_cost([running], now=220.0) == pytest.approx(3.6 * 120 / 3600)
    assert spent_cost([running, ended], now=220.0) == pytest.approx(3.6 * 180 / 3600)
    assert projected_cost([running, ended], now=220.0, finish=400.0) == pytest.approx(3.6 * (300 + 60) / 3600)
    assert billed_cost_usd(3.6, 30) == pytest.approx(0.06)


def observed(rate: float, until: float, budget: float) -> ProgressMonitor:
    monitor = ProgressMonitor(1000, None, budget, start=0.0, window_s=2.0, bins=4)
    for i in range(1, int(rate * until) + 1):
        monitor.observe(i / rate, i)
    return monitor


def test_monitor_sees_a_certain_budget_violation():
    machine = Machine("m0", "local-a", "on_demand", "127.0.0.1", launched_at=0.0, price_per_hour=36.0)  # $0.01/s
    # 100 it/s: done at 10 s, billed the 60 s minimum: $0.60
    assert observed(100, 4.0, budget=0.7).check(4.0, [machine]).violation == ()
    assert observed(100, 4.0, budget=0.5).check(4.0, [machine]).violation == ("cost",)
    # 10 it/s: done at 100 s: $1.00
    verdict = observed(10, 4.0, budget=0.7).check(4.0, [machine])
    assert verdict.violation == ("cost",) and verdict.projected_cost_usd == pytest.approx(1.0, rel=0.02)
    assert verdict.spent_usd == pytest.approx(0.6)


# -- re-planning ----------------------------------------------------------------------

def test_replan_problem_keeps_survivors_of_a_depleted_market_and_subtracts_progress():
    problem = parse_problem(demo_problem(limits={"time_s": 100, "cost_usd": 1.0}, overheads={"launch_s": 5}))
    changes = replan_changes(problem, remaining_iterations=25, elapsed_s=40, spent_usd=0.25,
                             depleted={("local-a", "spot")}, survivors={("local-a", "spot"): 1}, launch_s=8)
    assert changes["iterations"] == 25
    assert changes["limits"].time_s == 60 and changes["limits"].cost_usd == 0.75
    assert changes["overheads"].launch_s == 8
    quotas = {(c.instance_type, c.market): c.quota for c in changes["instances"]}
    assert quotas == {("local-a", "spot"): 1, ("local-b", "spot"): 2, ("local-b", "on_demand"): 2}
    gone = replan_changes(problem, remaining_iterations=25, elapsed_s=40, spent_usd=0.25,
                          depleted={("local-a", "spot")}, survivors={}, launch_s=1)
    assert ("local-a", "spot") not in {(c.instance_type, c.market) for c in gone["instances"]}
    assert gone["overheads"].launch_s == 5  # never less than the problem's own
    with pytest.raises(ReplanInfeasible, match="time limit"):
        replan_changes(problem, remaining_iterations=5, elapsed_s=101, spent_usd=0, depleted=set(), survivors={},
                       launch_s=0)
    with pytest.raises(ReplanInfeasible, match="no machine choice"):
        replan_changes(problem, remaining_iterations=5, elapsed_s=1, spent_usd=0, survivors={}, launch_s=0,
                       depleted={(c.instance_type, c.market) for c in problem.instances})


def test_replanner_never_asks_for_a_depleted_market_again():
    problem = parse_problem(demo_problem(limits={"time_s": 3600}))
    replanner = Replanner(problem)
    replanner.deplete(("local-a", "spot"))
    r = replanner.replan("preemption", old_plan=None, remaining_iterations=30, elapsed_s=10, spent_usd=0.0,
                         survivors={("local-b", "spot"): 1}, launch_s=2, event_at=0.0)
    assert r.new_plan.feasible and r.problem.iterations == 30
    assert all((a.instance_type, a.market) != ("local-a", "spot") for a in r.new_plan.allocation)
    assert sum(a.count * a.batch_per_instance for a in r.new_plan.allocation) == 16
    assert r.new_plan.predicted.total_s <= r.problem.limits.time_s


def test_replanner_reports_an_infeasible_remainder():
    problem = parse_problem(demo_problem(limits={"time_s": 3600}))
    replanner = Replanner(problem)
    with pytest.raises(ReplanInfeasible, match="no plan meets"):
        replanner.replan("preemption", old_plan=None, remaining_iterations=10**6, elapsed_s=3590, spent_usd=0.0,
                         survivors={}, launch_s=2, event_at=0.0)


# -- plans against problems -----------------------------------------------------------

@pytest.mark.parametrize("allocation, path", [
    ((("local-c", "spot", 1, 16),), "allocation[0]"),
    ((("local-a", "spot", 3, 4), ("local-b", "spot", 1, 4)), "allocation[0].count"),
    ((("local-a", "spot", 1, 8),), "allocation"),
    ((("local-a", "spot", 0, 16),), "allocation[0].count"),
])
def test_a_plan_that_does_not_match_its_problem_names_the_field(allocation, path):
    problem = parse_problem(demo_problem())
    with pytest.raises(ProblemError) as e:
        check_plan(as_plan(plan_dict(*allocation)), problem, load_catalog(DEMO_CATALOG))
    assert e.value.path == path


def test_an_infeasible_or_tuning_plan_is_not_run():
    problem = parse_problem(demo_problem())
    with pytest.raises(ProblemError, match="nothing to run"):
        check_plan(as_plan({**plan_dict(("local-a", "spot", 1, 16)), "status": "infeasible"}), problem,
                   load_catalog(DEMO_CATALOG))
    with pytest.raises(ProblemError, match="'training' plans"):
        as_plan({"kind": "tuning", "stages": []})


# -- hooks, run log, faults -----------------------------------------------------------

def test_hooks_register_and_reject_unknown_events():
    hooks, seen = Hooks(), []

    @hooks.on("preemption")
    def first(event):
        seen.append(("first", event))

    hooks.on("preemption", lambda e: seen.append(("second", e)))
    hooks.emit("preemption", 1)
    assert seen == [("first", 1), ("second", 1)]
    with pytest.raises(ProblemError, match="did you mean 'preemption'"):
        hooks.on("preemtion", print)
    with pytest.raises(ProblemError, match="callable"):
        hooks.on("finished", 3)


def test_run_log_is_json_lines(tmp_path):
    with RunLog(tmp_path / "run.jsonl", start=100.0) as log:
        log.write("start", at=100.5, plan={"a": 1})
        log.write("preemption", **json_object(Preemption("local-a", "spot", "injector", "m0", 120.0, at=101.0)))
    events = read_run_log(tmp_path / "run.jsonl")
    assert [e["event"] for e in events] == ["start", "preemption"]
    assert events[1]["elapsed_s"] == pytest.approx(1.0) and events[1]["time_left_s"] == 120.0
    (tmp_path / "bad.jsonl").write_text('{"event": "start"}\nnot json\n')
    with pytest.raises(ProblemError, match="line 2"):
        read_run_log(tmp_path / "bad.jsonl")


def slots(machines: list[int]) -> list[RankSlot]:
    out = []
    for index, workers in enumerate(machines):
        for local in range(workers):
            out.append(RankSlot(len(out), f"m{index}", "local-a", "spot", "127.0.0.1", index, local, workers, 4))
    return out


def test_fault_injector_assigns_faults_to_the_machines_workers_and_fires_each_kill_once():
    injector = FaultInjector([KillWorker(1, at_iteration=20), KillWorker(0, at_iteration=30, warning_s=120),
                              KillWorker(0, at_time_s=5.0), SlowWorker(1, from_iteration=5, extra_s=0.1)])
    faults = injector.worker_faults(0, slots([1, 2]), start_iteration=0)
    assert sorted((f.rank, f.kind, f.at_iteration) for f in faults) == [
        (0, "notice", 30), (1, "kill", 20), (1, "slow", 5), (2, "kill", 20), (2, "slow", 5)]
    assert injector.due(4.9, machines=2) == []
    assert [a.machine for a in injector.due(5.0, machines=2)] == [0]
    assert injector.due(6.0, machines=2) == []
    injector.reached(25)  # the kill at 20 happened; the notice at 30 is still to come
    later = injector.worker_faults(1, slots([1]), start_iteration=20)
    assert [(f.kind, f.at_iteration) for f in later] == [("notice", 30)]
    with pytest.raises(ProblemError, match="exactly one"):
        KillWorker(0)


# -- the local provider ---------------------------------------------------------------

def test_local_provider_bills_prices_capacity_and_notices():
    with LocalProvider("t1", DEMO_CATALOG, capacity={("local-a", "spot"): 1}) as provider:
        [m] = provider.provision("local-a", 1, "spot")
        assert m.host == "127.0.0.1" and m.price_per_hour == 0.40 and provider.machines() == [m]
        with pytest.raises(CapacityError) as e:
            provider.provision("local-a", 1, "spot")
        assert e.value.as_preemption().key == ("local-a", "spot")
        event = provider.interrupt(m.id, time_left_s=120.0)
        assert provider.poll_interruptions() == [event] and provider.poll_interruptions() == []
        assert event.source == "injector" and event.time_left_s == 120.0
        [b] = provider.provision("local-b", 1, "on_demand")
    assert provider.machines() == []  # closing gave everything back
    assert all(x.terminated_at is not None for x in provider.all_machines())
    with pytest.raises(ProblemError, match="CPU worker processes"):
        LocalProvider("t2").provision("p3.8xlarge", 1)


# -- checkpoints and trainers ---------------------------------------------------------

def test_checkpoint_write_is_atomic_and_a_failed_save_keeps_the_last_one(tmp_path):
    torch = pytest.importorskip("torch")
    from thrifty.runtime.ddp.checkpoint import load_checkpoint, save_checkpoint

    path = tmp_path / "checkpoint.pt"
    seconds, size = save_checkpoint(path, {"iteration": 5, "model": {"w": torch.ones(3)}})
    assert size == path.stat().st_size and seconds >= 0
    with pytest.raises((pickle.PicklingError, AttributeError)):  # which one depends on the pickler
        save_checkpoint(path, {"iteration": 6, "model": lambda: None})  # cannot be pickled
    state = load_checkpoint(path)
    assert state["iteration"] == 5 and torch.equal(state["model"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary left behind
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ProblemError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path / "bad.pt")
    assert load_checkpoint(tmp_path / "none.pt") is None


def test_rng_states_round_trip():
    torch = pytest.importorskip("torch")
    import random

    from thrifty.runtime.ddp.checkpoint import capture_rng, restore_rng

    state = capture_rng()
    first = (torch.rand(3), random.random(), np.random.rand())
    restore_rng(state)
    again = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]


def bad_factory():
    raise RuntimeError("no data here")


def not_a_trainer():
    return 42


@pytest.mark.parametrize("spec, message", [
    ("thrifty.runtime.training.examples:nope", "has no attribute 'nope'"),
    ("no.such.module:f", "no module named"),
    ("not a spec", "must be 'package.module:function'"),
    ("test_training_runtime_units:bad_factory", "raised RuntimeError: no data here"),
    ("test_training_runtime_units:not_a_trainer", "returned a int"),
])
def test_a_bad_trainer_is_a_clear_error(spec, message):
    from thrifty.runtime.ddp.trainer import load_trainer

    with pytest.raises(ProblemError, match=message):
        load_trainer(spec)


def test_train_rejects_bad_input_before_starting_anything(tmp_path):
    from thrifty.runtime.training import train

    problem = demo_problem()
    with pytest.raises(ProblemError, match="global batch is 16"):
        train(plan_dict(("local-a", "spot", 1, 8)), "thrifty.runtime.training.examples:tiny_mlp",
              problem=problem, run_dir=tmp_path / "a")
    with pytest.raises(ProblemError, match="raised RuntimeError"):
        train(plan_dict(("local-a", "spot", 1, 16)), "test_training_runtime_units:bad_factory",
              problem=problem, run_dir=tmp_path / "b")
    with pytest.raises(ProblemError, match="importable"):
        train(plan_dict(("local-a", "spot", 1, 16)), lambda: None, problem=problem, run_dir=tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# -- the command line -----------------------------------------------------------------

def test_run_command_bad_input_exits_2(tmp_path, capsys):
    from thrifty.runtime.cli import main

    problem = tmp_path / "problem.json"
    problem.write_text(json.dumps(demo_problem()))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_dict(("local-a", "spot", 1, 8))))
    trainer = "thrifty.runtime.training.examples:tiny_mlp"
    assert main(["run", str(plan), "--problem", str(problem), "--trainer", trainer]) == 2
    assert "allocation: places 8 samples" in capsys.readouterr().err
    assert main(["run", str(plan), "--trainer", trainer]) == 2
    assert "--problem PROBLEM.json is required" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["run", str(plan), "--trainer", trainer, "--inject", "kill:machine=0"])
    assert e.value.code == 2
    assert "exactly one of at_iteration and at_time_s" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", str(plan), "--trainer", trainer, "--trainer-args", "[1]"])
    assert "must be a JSON object" in capsys.readouterr().err


def test_demo_catalog_is_what_its_script_builds_and_says_its_prices_are_made_up():
    script = load_script(ROOT / "datasets" / "scripts" / "build_local_demo_catalog.py")
    assert json.loads(Path(DEMO_CATALOG).read_text()) == script.build()
    catalog = load_catalog(DEMO_CATALOG)
    assert all(t.device == "cpu" and "demo price" in t.price_source for t in catalog.types.values())


# --- the one job spec: training jobs and tuning trials -------------------------------------------

def test_job_spec_round_trips_a_training_job_and_a_tuning_trial(tmp_path):
    from thrifty.runtime.ddp.job import JobSpec, WorkerFault

    training = JobSpec(trainer="m:f", global_batch=24, iterations=10, batches=(8, 16), checkpoint_path="c.pt",
                       faults=(WorkerFault(rank=1, kind="slow", at_iteration=2, seconds=0.1),), machine_ids=("a", "b"))
    trial = JobSpec(trainer="m:f", trainer_args={"lr": 0.1}, checkpoint_path="t.pt", restore="required",
                    steps_per_iteration=None, checkpoint_every=None, evaluate=True, await_decision=True,
                    metrics_every_s=None, weighting="hook")
    for job in (training, trial):
        path = tmp_path / "job.json"
        job.write(path)
        assert JobSpec.read(path) == job
    assert trial.global_batch is None and trial.batches is None and trial.iterations is None


@pytest.mark.parametrize("changes, path", [
    ({"iterations": None}, "iterations"),  # a job that does not await decisions needs an end
    ({"restore": "sometimes"}, "restore"),
    ({"steps_per_iteration": 0}, "steps_per_iteration"),
    ({"batches": (8, 8)}, "batches"),  # sums to 16, not the global 24
    ({"weighting": "mean"}, "weighting"),  # plain averaging of unequal batches
])
def test_job_spec_names_the_bad_field(changes, path):
    from thrifty.runtime.ddp.job import JobSpec

    fields = {"trainer": "m:f", "global_batch": 24, "iterations": 10, "batches": (8, 16), "checkpoint_path": "c.pt"}
    with pytest.raises(ProblemError) as caught:
        JobSpec(**{**fields, **changes})
    assert caught.value.path == path


def test_a_segment_reports_its_measured_iteration_against_the_prediction():
    from thrifty.runtime.training.records import SegmentRecord
    from thrifty.runtime.training.report import _describe, format_prediction_check

    record = SegmentRecord(0, "2xlocal@32", (32, 32), 0, 100, 100, "finished", 0.5, (), throughput=20.0,
                           predicted_iteration_s=0.04)
    assert record.actual_iteration_s == pytest.approx(0.05)
    assert record.prediction_ratio == pytest.approx(1.25)
    line = format_prediction_check([json_object(record)])
    assert "segment 0 2xlocal@32: 50.0 ms measured, 40.0 ms predicted (1.25x)" in line
    assert "(1.25x)" in _describe({"event": "segment_end", **json_object(record)})
    unmeasured = SegmentRecord(1, "2xlocal@32", (32, 32), 0, 3, 0, "lost", None, (), throughput=None,
                               predicted_iteration_s=0.04)
    assert unmeasured.prediction_ratio is None and format_prediction_check([json_object(unmeasured)]) == ""


def test_a_node_leased_twice_by_one_run_keeps_both_leases_on_the_bill():
    """A Ray node that carries a machine id (an EC2 instance joined to the
    cluster) given back and taken again gets a new lease id: the first
    lease's record, and its cost, stay in `all_machines`."""
    import itertools

    from thrifty.runtime.cluster.provider import RayProvider
    from thrifty.runtime.providers.base import Provider

    provider = RayProvider.__new__(RayProvider)  # the lease rule alone: no Ray cluster needed
    Provider.__init__(provider, "run1")
    provider._ids = itertools.count()
    node = {"machine_id": "i-0abc", "node_id": "n1", "ip": "10.0.0.5"}
    first = Machine(provider._lease_id(node), "g4dn.8xlarge", "spot", "10.0.0.5", 0.0, 1.0)
    provider._own([first])
    Provider.terminate(provider, [first])  # the base class keeps the record; Ray has no agent to drop here
    second = Machine(provider._lease_id(node), "g4dn.8xlarge", "spot", "10.0.0.5", 100.0, 1.0)
    provider._own([second])
    assert first.id == "i-0abc" and second.id.startswith("i-0abc~") and second.id != first.id
    assert {m.id for m in provider.all_machines()} == {first.id, second.id}
    assert provider._lease_id({"machine_id": None}).startswith("ray-run1-")
