"""Online calibration (issue 36): the update's mathematics (shrinkage toward
the prior profile with little evidence, toward the data with much; a random
walk's tracking), a device's correction carried to the other types of that
device, a re-plan solved with the corrected models and saying so, the first
window whose corrected models leave no plan within the limits saying so with
the least change (fake clocks: the segment watch fed clock readings), the
corrected profile saved and named by a later problem, ``--save-profile``'s
bad input, and one short real run whose workers' clock marks calibrate."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from thrifty.datasets.catalog import load_catalog
from thrifty.perfmodels.calibration import (COMPUTE_PRIOR_SD, Belief, Calibration, CorrectedLibrary, Evidence,
                                            component_predictions, compute_prior_sd, corrected_simulator,
                                            host_contention_sd)
from thrifty.perfmodels.library import ModelLibrary
from thrifty.core.validation import json_object
from thrifty.runtime.providers.base import Machine
from thrifty.runtime.training.launcher import RankSlot
from thrifty.runtime.training.calibration import OnlineCalibrator, save_corrected_profile
from thrifty.runtime.training.hooks import Hooks
from thrifty.runtime.training.monitor import ProgressMonitor
from thrifty.runtime.training.replan import Replanner
from thrifty.runtime.training.runlog import RunLog
from thrifty.runtime.training.watch import SegmentWatch
from thrifty.solver import solve
from thrifty.solver.problem import load_problem, parse_problem
from thrifty.solver.training import TrainingSpace

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "datasets" / "examples" / "local-demo-srifty54.json"
ZOO = "thrifty.runtime.training.examples:zoo"
SD = COMPUTE_PRIOR_SD["measured"]


# -- the update ------------------------------------------------------------------------

def test_little_evidence_stays_near_the_prior_and_much_goes_to_the_data():
    truth = 3.0
    weak = Belief(SD).update(Evidence(truth, 1.0, sd_s=3.0, count=1))  # one iteration, as noisy as it is long
    strong = Belief(SD).update(Evidence(truth, 1.0, sd_s=0.03, count=2000))
    assert weak.factor < 1.01  # v = 1 against a prior variance of 0.0048: almost all prior
    assert abs(strong.factor / truth - 1) < 0.01
    # the conjugate normal update, exactly: K = s0^2 / (s0^2 + v), mean = K y
    ev = Evidence(2.0, 1.0, sd_s=0.4, count=25)
    v = (0.4 / 2.0) ** 2 / 25
    one = Belief(SD).update(ev)
    assert one.mean == pytest.approx(SD ** 2 / (SD ** 2 + v) * math.log(2.0))
    assert one.sd ** 2 == pytest.approx(SD ** 2 * v / (SD ** 2 + v))
    # more windows of the same evidence: closer to the data each time, never past it
    b = one
    for _ in range(5):
        nxt = b.update(ev)
        assert b.mean < nxt.mean <= math.log(2.0)
        b = nxt
    assert b.q == 0.0  # windows that agree: no random walk


def test_a_shared_host_widens_the_prior_by_the_contention_it_shows():
    assert host_contention_sd(2, 2) == 0.0 and host_contention_sd(None, 2) == 0.0  # the profile's own two workers
    assert host_contention_sd(8, 2) == pytest.approx(math.log(4))
    assert compute_prior_sd("measured") == SD
    wide = compute_prior_sd("measured", host_contention_sd(8, 2))
    assert wide == pytest.approx(math.hypot(SD, math.log(4)))
    # the same window moves a belief with the wider prior further toward the data
    ev = Evidence(3.0, 1.0, 0.6, 20)
    assert Belief(wide).update(ev).factor > Belief(SD).update(ev).factor


def test_a_jump_between_windows_widens_the_walk_and_the_belief_tracks_it():
    b = Belief(SD)
    for _ in range(4):
        b = b.update(Evidence(1.0, 1.0, sd_s=0.05, count=50))
    still = b.update(Evidence(3.0, 1.0, sd_s=0.15, count=50))  # the host got busy
    assert still.q > 0
    after = still.update(Evidence(3.0, 1.0, sd_s=0.15, count=50))
    assert after.factor > still.factor > 1.5 and abs(after.factor / 3.0 - 1) < 0.1


def test_a_correction_carries_to_every_type_of_the_same_device_and_no_other():
    lib, catalog = ModelLibrary(), load_catalog()
    cal = Calibration()
    cal.observe_compute("V100", "forward", Evidence(2.0, 1.0, 0.01, 1000), SD)
    cal.observe_compute("V100", "backward", Evidence(1.5, 1.0, 0.01, 1000), SD)
    corrected = CorrectedLibrary(lib, cal)
    for name in ("p3.2xlarge", "p3.8xlarge"):  # both V100
        itype = catalog.get(name)
        base, fixed = lib.get("resnet50", itype.device, name), corrected.get("resnet50", itype.device, name)
        assert float(fixed.forward_s(32)) == pytest.approx(float(base.forward_s(32)) * cal.compute_factors("V100")[
            "forward"])
        assert float(fixed.backward_s(32)) / float(base.backward_s(32)) == pytest.approx(1.5, rel=0.01)
        assert fixed.step_s == base.step_s and fixed.max_batch == base.max_batch
    t4 = catalog.get("g4dn.xlarge")
    assert corrected.get("resnet50", t4.device, t4.name) is lib.get("resnet50", t4.device, t4.name)


@pytest.fixture(scope="module")
def demo():
    problem = load_problem(DEMO)
    space = TrainingSpace(problem)
    return problem, space, load_catalog(problem.catalog)


def test_the_exchange_correction_scales_the_exposed_exchange_where_nothing_overlaps(demo):
    problem, space, catalog = demo
    groups = space.groups(space.candidate([("local-a", 2, 32)]))
    cal = Calibration()
    cal.observe_exchange("local-a", Evidence(2.0, 1.0, 0.01, 5000), 0.2)
    prior = component_predictions(space.simulator, groups)
    after = component_predictions(corrected_simulator(space.simulator, cal), groups)
    assert after.exchange_s / prior.exchange_s == pytest.approx(cal.exchange_factor("local-a"), rel=1e-6)
    assert after.compute == prior.compute


def test_a_plan_on_corrected_models_says_corrected_online_with_its_prior(demo):
    """Provenance: a type whose device or exchange was corrected says so,
    with the figure it was corrected from as its prior; others are as before."""
    problem, space, catalog = demo
    cal = slower(Calibration(), 2.0, windows=2)
    sim = corrected_simulator(space.simulator, cal)
    local_a = catalog.get("local-a")
    before, after = space.simulator.sources(local_a), sim.sources(local_a)
    assert after.compute.kind == "corrected" and after.compute.prior == before.compute
    assert after.allreduce.kind == "corrected" and after.allreduce.prior == before.allreduce
    plain = Calibration()
    assert corrected_simulator(space.simulator, plain).sources(local_a) == before


# -- re-planning and forecasting with the corrected models -----------------------------

def slower(cal: Calibration, factor: float, windows: int = 6) -> Calibration:
    """`cal` after `windows` windows that measured every component `factor` times the prior."""
    for _ in range(windows):
        for c in ("forward", "backward", "step"):
            cal.observe_compute("cpu", c, Evidence(factor, 1.0, 0.02, 400), SD)
        cal.observe_exchange("local-a", Evidence(factor, 1.0, 0.02, 400), 0.2)
    return cal


def test_a_re_plan_solves_with_the_corrected_models_and_says_what_it_assumed(demo):
    problem, space, catalog = demo
    roomy = problem.model_copy(update={"limits": problem.limits.model_copy(update={"time_s": 400.0})})
    calibrator = OnlineCalibrator(lambda: space.derive(limits=roomy.limits), catalog, 2.5, slower(Calibration(), 3.0))
    plain, corrected = Replanner(roomy, space=space.derive(limits=roomy.limits)), Replanner(roomy, space=space)
    corrected.corrections = calibrator
    args = dict(old_plan=None, remaining_iterations=500, elapsed_s=5.0, spent_usd=0.01, survivors={},
                launch_s=5.0, event_at=time.time())
    before, after = plain.replan("slowdown", **args), corrected.replan("slowdown", **args)
    assert before.assumed is None and "cpu compute forward x" in after.assumed
    groups = calibrator.space().groups(calibrator.space().candidate(
        [(a.instance_type, a.count, a.batch_per_instance) for a in after.new_plan.allocation]))
    assert after.new_plan.predicted.iteration_s == pytest.approx(calibrator.iteration_s(groups))
    assert after.new_plan.predicted.iteration_s > 2.5 * before.new_plan.predicted.iteration_s
    assert json_object(after)["assumed"] == after.assumed and "assumed" not in json_object(before)  # the run log


class FakeRun:
    """What the segment watch uses of a run, with a fake clock: the calibrator and
    the re-planner are real, the workers are clock readings fed to it."""

    def __init__(self, tmp: Path, problem: Any, space: TrainingSpace, catalog: Any, elapsed_s: float):
        now = time.time()
        self.problem, self.start, self.done = problem, now - elapsed_s, 0
        self.log, self.hooks = RunLog(tmp / "run.jsonl", start=self.start), Hooks()
        self.calibrator = OnlineCalibrator(lambda: space, catalog, 2.5)
        self.replanner = Replanner(problem, space=space)
        self.replanner.corrections = self.calibrator
        self.machines = {f"m{i}": Machine(f"m{i}", "local-a", "spot", "127.0.0.1", self.start, 0.4) for i in (0, 1)}
        self.monitor = ProgressMonitor(problem.iterations, problem.limits.time_s, problem.limits.cost_usd, self.start)
        self.said: list[Any] = []
        self.hooks.on("infeasible_forecast", self.said.append)

    def forecast(self, remaining: int, now: float):
        return self.replanner.forecast(remaining_iterations=remaining, elapsed_s=now - self.start, spent_usd=0.0134,
                                       survivors={("local-a", "spot"): 2}, launch_s=5.0)


def reading(iteration: int, count: int, at: float, means: dict[str, float], cv: float = 0.1) -> dict:
    return {"iteration": iteration, "at": at, "count": count,
            "sum": {k: count * m for k, m in means.items()},
            "sumsq": {k: count * m * m * (1 + cv * cv) for k, m in means.items()}}


def feed_window(watch: SegmentWatch, run: FakeRun, factor: float, reached: int) -> None:
    """Two readings of both ranks 2.5 s apart, every component `factor` times the prior's."""
    prior = component_predictions(run.calibrator.base.simulator, watch.groups)
    means = {**prior.compute["local-a"], "exchange": prior.exchange_s}
    means = {k: v * factor for k, v in means.items()}
    now = time.time()
    iteration_s = prior.iteration.mean_s * factor
    first = {r: reading(reached - 35, 5, now - 2.6, means) for r in (0, 1)}
    run.calibrator.observe(first, now - 2.6)
    last = {r: reading(reached, 40, now - 2.6 + 35 * iteration_s, means) for r in (0, 1)}
    run.calibrator.observe(last, now)
    watch.reached = reached
    assert run.calibrator.window_due(now, 2)
    watch._calibrate(now, 0.0134)


def demo_watch(tmp_path: Path, demo, elapsed_s: float) -> tuple[SegmentWatch, FakeRun]:
    problem, space, catalog = demo
    run = FakeRun(tmp_path, problem, space, catalog, elapsed_s)
    plan = solve(problem, space=space.derive())
    slots = [RankSlot(r, f"m{r}", "local-a", "spot", "127.0.0.1", r, 0, 1, 32) for r in (0, 1)]
    return SegmentWatch(run, plan, slots, 0, run.start), run  # type: ignore[arg-type]


def test_the_first_window_that_leaves_no_plan_says_so_with_the_least_change(tmp_path, demo):
    watch, run = demo_watch(tmp_path, demo, elapsed_s=4.0)
    feed_window(watch, run, factor=3.0, reached=40)
    events = {e["event"]: e for e in run.log.events}
    assert events["calibration"]["window"] == 1
    assert events["calibration"]["corrected"]["iteration_s"] > 2 * events["calibration"]["prior"]["iteration_s"]
    forecast = events["infeasible_forecast"]
    assert forecast["window"] == 1 and run.said and run.said[0].window == 1
    times = [r["needed_total"] for r in forecast["relaxations"] if r.get("field") == "limits.time_s"]
    assert times and min(times) > 30.0  # the least time limit that admits a plan, for the whole run
    kept = next(r for r in forecast["relaxations"] if r["plan"] == "the plan in force, kept")
    assert kept["needed_total"] == pytest.approx(forecast["kept_total_s"])
    assert "least change: time limit >=" in str(run.said[0]) and "corrected models" in str(run.said[0])


def test_a_window_that_measures_what_the_profile_says_forecasts_nothing(tmp_path, demo):
    watch, run = demo_watch(tmp_path, demo, elapsed_s=4.0)
    feed_window(watch, run, factor=1.0, reached=120)
    kinds = [e["event"] for e in run.log.events]
    assert kinds == ["calibration"] and not run.said
    factors = run.log.events[0]["factors"]["compute"]["cpu"]
    assert all(abs(factors[c]["factor"] - 1) < 0.02 for c in ("forward", "backward", "step"))


# -- the corrected profile ---------------------------------------------------------------

def test_the_saved_profile_is_the_corrected_model_and_a_later_problem_names_it(tmp_path, demo):
    problem, space, catalog = demo
    watch, run = demo_watch(tmp_path, demo, elapsed_s=4.0)
    feed_window(watch, run, factor=2.0, reached=40)
    out = tmp_path / "corrected.json"
    said = save_corrected_profile(run.log.events, problem, out)
    assert "tiny-transformer on cpu" in said and not list(tmp_path.glob("*.tmp*"))
    data = json.loads(out.read_text())
    assert data["format"] == "thrifty.compute_profile/1" and data["provenance"]["kind"] == "derived"
    later = parse_problem({**json.loads(DEMO.read_text()), "model": str(out),
                           "catalog": str(DEMO.parent / "local-demo-catalog.json"),
                           "limits": {"time_s": 300, "cost_usd": 1.0}})
    later_space = TrainingSpace(later)
    groups = watch.groups
    saved = later_space.simulator.simulate(groups)
    corrected = run.calibrator.simulator().simulate(groups)
    prior = space.simulator.simulate(groups)
    # the saved profile carries the compute corrections (forward, backward, step, DDP overhead); the
    # exchange's bus bandwidth is the allreduce model's, not the profile's
    assert saved.forward_s == pytest.approx(corrected.forward_s, rel=0.02)
    assert saved.backward_s == pytest.approx(corrected.backward_s, rel=0.02)
    assert saved.mean_s > 1.5 * prior.mean_s
    assert solve(later).feasible


def test_save_profile_refuses_a_run_without_a_window(tmp_path, demo):
    from thrifty.core.errors import ProblemError

    with pytest.raises(ProblemError, match="no calibration window"):
        save_corrected_profile([{"event": "start"}], demo[0], tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_save_profile_where_no_file_can_be_is_a_usage_error_before_anything_runs(tmp_path, capsys):
    from thrifty.runtime.cli import main

    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["run", str(DEMO), "--trainer", ZOO, "--out", str(tmp_path / "run"),
              "--save-profile", str(tmp_path / "file" / "profile.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2
    assert err[-1].startswith("thrifty run: error: argument --save-profile:") and "is a file, not a folder" in err[-1]
    assert not (tmp_path / "run").exists()


# -- a real run ------------------------------------------------------------------------

def test_the_workers_clock_marks_calibrate_a_real_run_and_its_re_plan_assumes_them(tmp_path):
    """Two tiny-MLP workers, one slowed by 10 ms an iteration (so that every
    host takes at least 1.5 s to iteration 150); each half-second window
    corrects the models from their clock marks; the machine lost at iteration
    150 re-plans with the corrected models, and says so."""
    pytest.importorskip("torch")
    from test_run_behaviour import QUICK, TINY
    from test_training_runtime_processes import worker_pids
    from test_training_runtime_units import demo_problem, plan_dict

    from thrifty.runtime.training import KillWorker, RunConfig, SlowWorker, read_run_log, train

    result = train(plan_dict(("local-a", "spot", 2, 8)), TINY, run_dir=tmp_path,
                   problem=demo_problem(iterations=200, limits={"time_s": 600}),
                   config=RunConfig(**{**QUICK, "window_s": 0.5}), faults=[SlowWorker(0, 0, 0.01), KillWorker(1, 150)])
    assert worker_pids() == []
    events = read_run_log(result.log_path)
    windows = [e for e in events if e["event"] == "calibration"]
    assert windows and windows[0]["window"] == 1
    first = windows[0]
    assert all(first["measured"]["compute"]["local-a"][c] > 0 for c in ("forward", "backward", "step"))
    assert first["measured"]["exchange_s"] > 0 and first["factors"]["exchange"]["local-a"]["windows"] == 1
    replan = next(e for e in events if e["event"] == "replan")
    assert "cpu compute forward x" in replan["assumed"]
    assert result.segments[0].corrected_iteration_s is not None
