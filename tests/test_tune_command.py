"""`thrifty tune`: one experiment file, end to end, with real worker processes.

Every scheduler name runs a small experiment to its end on this host; `plan`
carries out a RubberBand plan on the local provider; a driver killed with
SIGKILL resumes with --resume and keeps every finished trial; bad files exit
2 naming the field. The trainer is the tuning runtime's small example (a few
milliseconds an iteration), so each run takes a few seconds, most of it the
fork server's start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from thrifty.runtime.cli import main
from thrifty.runtime.tuning.driver import tune
from thrifty.runtime.tuning.experiment_file import SCHEDULER_NAMES, parse_experiment
from thrifty.runtime.tuning.record import read_events, read_history
from thrifty.runtime.tuning.trial import TrialState

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "thrifty.runtime.tuning.executors.worlds:example_trainer"
CATALOG = str(ROOT / "datasets" / "examples" / "local-demo-catalog.json")
SPACE = {"lr": {"loguniform": [0.003, 0.5]}, "hidden": {"choice": [4, 16]}}


def experiment(scheduler: dict, **changes) -> dict:
    base = {"name": "small", "trainer": EXAMPLE, "search_space": SPACE, "samples": 4, "seed": 1,
            "max_iterations": 4, "scheduler": scheduler, "deadline_s": 120, "resources": {"atoms": 2},
            "iteration_timeout_s": 60}
    base.update(changes)
    return base


def scaling_profile(tmp_path: Path) -> str:
    """The example trainer on local-a: about 0.05 s an iteration on one worker, 0.04 s on two."""
    path = tmp_path / "example-profile.json"
    path.write_text(json.dumps({"format": "thrifty.scaling_profile/1", "model": "example", "instance_type": "local-a",
                                "startup_s": 0.5, "points": [{"gpus": 1, "iteration_s": 0.05},
                                                             {"gpus": 2, "iteration_s": 0.04}]}))
    return str(path)


SCHEDULERS = {
    "hypersched": {"name": "hypersched", "min_iterations": 1, "eta": 2},
    "asha": {"name": "asha", "min_iterations": 1, "eta": 2},
    "pop": {"name": "pop", "target": 0.99, "boundary": 2},
    "bandit": {"name": "bandit", "boundary": 2},
    "earlyterm": {"name": "earlyterm", "boundary": 2},
    "fifo": {"name": "fifo"},
}


def check_results(folder: Path, result) -> None:
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["best"]["trial"] == result.best_trial_id is not None
    assert json.loads((folder / "best" / "config.json").read_text()) == summary["best"]["config"]
    assert (folder / "tuning.png").stat().st_size > 10_000
    events = read_events(folder / "events.jsonl")
    results = [e for e in events if e["event"] == "result"]
    assert len(results) == sum(t.iteration for t in result.trials) and results
    assert {e["trial"] for e in events if e["event"] == "launch"} == {t.trial_id for t in result.trials}
    assert not any(t.state == TrialState.RUNNING for t in result.trials)
    assert not any(t.error for t in result.trials), [t.error for t in result.trials]
    # every result also went to metrics.jsonl, tagged with its trial, step = its iteration
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    name = result.experiment.metric
    assert [(m["tags"], m["step"], m["metrics"][name], m["metrics"]["iteration_s"]) for m in metrics] == [
        ({"trial": str(e["trial"])}, e["iteration"], e["metric"], e["iteration_s"]) for e in results]


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_loop_scheduler_runs_a_small_experiment_to_its_end(tmp_path, name):
    result = tune(experiment(SCHEDULERS[name]), out=tmp_path / "out")
    check_results(tmp_path / "out", result)
    assert result.end_reason in ("exhausted", "target")
    # ASHA leaves the trials it never promotes paused (with their checkpoints) when it ends
    assert len(result.trials) == 4 and all(t.state in (TrialState.COMPLETED, TrialState.TERMINATED,
                                                       TrialState.PAUSED) for t in result.trials)
    assert all(t.iteration == 4 for t in result.trials if t.state == TrialState.COMPLETED)
    assert max(t.iteration for t in result.trials) >= 2  # past POP's, Bandit's and EarlyTerm's boundary
    best = result.trials[result.best_trial_id]
    if best.state == TrialState.COMPLETED:  # its final checkpoint is kept beside its configuration
        assert result.best_checkpoint and Path(result.best_checkpoint).stat().st_size > 0


def test_the_scheduler_names_are_the_ones_tested():
    assert set(SCHEDULER_NAMES) == set(SCHEDULERS) | {"plan"}


def test_plan_carries_out_the_rubberband_plan_on_the_local_provider(tmp_path):
    spec = experiment({"name": "plan", "min_iterations": 1, "eta": 2}, deadline_s=30, samples=4, max_iterations=4,
                      resources={"instance_type": "local-a", "catalog": CATALOG, "max_instances": 2,
                                 "model": scaling_profile(tmp_path)})
    out = tmp_path / "plan"
    result = tune(spec, out=out)
    plan = result.preview.plan
    assert plan is not None and plan.feasible and [s.trials for s in plan.stages] == [4, 2, 1]
    assert result.end_reason == "plan" and result.cost_usd > 0
    check_results(out, result)
    events = read_events(out / "events.jsonl")
    assert all("where" in e for e in events if e["event"] == "launch")  # placed by the placement controller
    survivor = result.trials[result.best_trial_id]
    assert survivor.state == TrialState.COMPLETED and survivor.iteration == 4


def test_a_plan_that_cannot_meet_its_deadline_exits_3(tmp_path, capsys):
    path = tmp_path / "tight.json"
    path.write_text(json.dumps(experiment({"name": "plan"}, deadline_s=0.2, max_iterations=2,
                                          resources={"instance_type": "local-a", "catalog": CATALOG,
                                                     "max_instances": 1, "model": scaling_profile(tmp_path)})))
    assert main(["tune", str(path), "--out", str(tmp_path / "x")]) == 3
    assert "infeasible" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_the_command_line_runs_the_file_shows_the_plan_and_keeps_the_results(tmp_path, capsys):
    path = tmp_path / "exp.yaml"
    spec = experiment(SCHEDULERS["hypersched"], target=0.5)
    import yaml

    path.write_text(yaml.safe_dump(spec))
    assert main(["tune", str(path), "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert "scheduler hypersched" in shown and "deadline 120 s" in shown and not (tmp_path / "out").exists()
    assert main(["tune", str(path), "--out", str(tmp_path / "out"), "--plot", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr()
    assert "best: trial" in out.out and (tmp_path / "p.png").stat().st_size > 10_000
    assert f"metrics: {tmp_path / 'out' / 'metrics.jsonl'}" in out.out  # where to look at every result
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["end_reason"] == "target" and summary["goal"]["met"] and summary["best"]["metric"] >= 0.5
    # a second run into the same folder is refused: resume it instead
    assert main(["tune", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "--resume" in capsys.readouterr().err


def _wait_for(predicate, timeout_s: float) -> None:
    limit = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > limit:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_a_killed_driver_resumes_and_loses_no_finished_trial(tmp_path):
    # slow enough iterations (about 0.1 s) that the kill lands mid-experiment
    spec = experiment({"name": "asha", "min_iterations": 1, "eta": 2}, samples=8, max_iterations=3,
                      trainer_args={"samples": 4096, "hidden": 32}, search_space={"lr": {"loguniform": [0.01, 0.5]}},
                      resources={"atoms": 1})
    path = tmp_path / "exp.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, "-m", "thrifty.runtime.cli", "tune", str(path), "--out", str(out),
                               "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    log = out / "events.jsonl"

    def finished_and_paused() -> bool:
        if not log.exists():
            return False
        h = read_history(read_events(log), 3)
        states = [t.state for t in h.trials]
        return TrialState.COMPLETED in states and TrialState.PAUSED in states
    try:
        _wait_for(finished_and_paused, 120)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver and every worker it forked
        driver.wait()
    before = read_events(log)
    kept = read_history(before, 3)
    done = {t.trial_id: list(t.metrics) for t in kept.trials if t.state in (TrialState.COMPLETED,
                                                                           TrialState.TERMINATED)}
    paused = {t.trial_id: t.iteration for t in kept.trials if t.state == TrialState.PAUSED}
    assert done and paused
    reported = len((out / "metrics.jsonl").read_text().splitlines())

    assert main(["tune", "--resume", str(out), "--json"]) in (0, 4)
    after = read_events(log)[len(before):]
    # the resumed driver sends each result it records (recovered ones too) to metrics.jsonl, after the others
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][reported:]
    assert [(m["tags"]["trial"], m["step"], m["metrics"]["accuracy"]) for m in metrics] == [
        (str(e["trial"]), e["iteration"], e["metric"]) for e in after if e["event"] == "result"]
    relaunched = [e for e in after if e["event"] == "launch"]
    assert not any(e["trial"] in done for e in relaunched)              # finished trials are kept as they were
    for e in relaunched:
        if e["trial"] in paused:                                          # paused ones go on from their checkpoint
            assert e["from_iteration"] == paused[e["trial"]]
    summary = json.loads((out / "summary.json").read_text())
    by_id = {t["trial"]: t for t in summary["per_trial"]}
    assert len(by_id) == 8 and all(by_id[tid]["iterations"] == len(m) for tid, m in done.items())
    assert summary["elapsed_s"] >= max(e["t"] for e in before)            # the time before the kill counts
    assert all(t["state"] != "running" for t in summary["per_trial"])


@pytest.mark.parametrize(("change", "field"), [
    ({"samples": "ten"}, "samples"),
    ({"scheduler": {"name": "hyperband-ish"}}, "scheduler.name"),
    ({"scheduler": "warp"}, "scheduler.name"),
    ({"trainer": "no_such_module_xyz:make"}, "trainer"),
    ({"trainer": "thrifty.runtime.tuning.examples:no_such_factory"}, "trainer"),
    ({"search_space": {}}, "search_space"),
    ({"search_space": {"lr": {"loguniform": [0.1, 0.01]}}}, "search_space.lr.loguniform"),
    ({"search_space": {"lr": {"gaussian": [0, 1]}}}, "search_space.lr"),
    ({"scheduler": {"name": "asha", "eta": 1}}, "scheduler.eta"),
    ({"scheduler": {"name": "asha", "min_iterations": 9}}, "scheduler.min_iterations"),
    ({"scheduler": {"name": "hypersched"}, "deadline_s": None}, "deadline_s"),
    ({"scheduler": {"name": "pop"}}, "target"),
    ({"scheduler": {"name": "pop", "target": 0.9, "learn_prior": "yes please"}}, "scheduler.learn_prior"),
    ({"scheduler": {"name": "plan"}}, "resources.instance_type"),
    ({"budget_usd": 1.0}, "resources.usd_per_atom_hour"),
    ({"resources": {"atoms": 0}}, "resources.atoms"),
    ({"max_iterations": -1}, "max_iterations"),
    ({"colour": "blue"}, "colour"),
    ({"metric_range": [1, 0]}, "metric_range"),
    ({"metric_range": [0, 1, 2]}, "metric_range"),
    ({"metric_range": ["low", 1]}, "metric_range[0]"),
    ({"scheduler": {"name": "pop", "target": 5}}, "scheduler.target"),
    ({"scheduler": {"name": "pop", "target": 0.9, "resume": "lifo"}}, "scheduler.resume"),
    # a value of another JSON type is refused, not converted
    ({"samples": True}, "samples"),
    ({"samples": "4"}, "samples"),
    ({"deadline_s": "120"}, "deadline_s"),
    ({"resources": {"atoms": True}}, "resources.atoms"),
    ({"scheduler": {"name": "asha", "eta": "3"}}, "scheduler.eta"),
    # numbers no run could use
    ({"seed": -1}, "seed"),
    ({"seed": 2**70}, "seed"),
    ({"threads": 10**9}, "threads"),
    ({"deadline_s": 1e300}, "deadline_s"),
    ({"budget_usd": 1e300, "resources": {"atoms": 2, "usd_per_atom_hour": 1}}, "budget_usd"),
    ({"iteration_timeout_s": 1e300}, "iteration_timeout_s"),
    ({"target": 5, "metric_range": [0, 1]}, "target"),
    ({"samples": 4.0}, "samples"),
    # the name is the results folder's
    ({"name": "../../escaped"}, "name"),
    ({"name": ".hidden"}, "name"),
    ({"name": "\ud800"}, "name"),
    ({"name": "\x1b[31mred"}, "name"),
    # what the trainer takes, and where the trials run
    ({"trainer_args": {"no_such_kw": 1}}, "trainer_args.no_such_kw"),
    ({"search_space": {"depth": {"choice": [1, 2]}}}, "search_space.depth"),
    ({"trainer_args": {"hidden": 8}}, "trainer_args.hidden"),
    ({"cluster": "nonsense"}, "cluster"),
    ({"storage": "gs://bucket/tuning"}, "storage"),
    ({"storage": "s3:///tuning"}, "storage"),
    ({"storage": ""}, "storage"),
    ({"resources": {"atoms": 2, "cloud": {"scale_latency_s": 1}}}, "resources.cloud"),
    ({"resources": {"atoms": 2, "max_instances": 4}}, "resources.max_instances"),
])
def test_bad_experiment_files_exit_2_naming_the_field(tmp_path, capsys, change, field):
    spec = {**experiment(SCHEDULERS["asha"]), **change}
    spec = {k: v for k, v in spec.items() if v is not None}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(spec))
    assert main(["tune", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    # one convention for every command's file errors: the file, then the field (as `thrifty solve` says them)
    assert err.startswith(f"thrifty tune: error: {path}: {field}:") and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_target_outside_the_default_range_is_fine_where_no_scheduler_assumes_the_range():
    e = parse_experiment({**experiment(SCHEDULERS["asha"]), "metric": "reward", "target": 200})
    assert e.target == 200


@pytest.mark.parametrize(("change", "field"), [
    ({"trainer": "no_such_module_xyz:make"}, "trainer"),
    ({"trainer": "thrifty.runtime.tuning.examples:no_such_factory"}, "trainer"),
    ({"trainer_args": {"no_such_kw": 1}}, "trainer_args.no_such_kw"),
    ({"cluster": "nonsense"}, "cluster"),
])
def test_a_dry_run_checks_what_a_run_would_before_it_starts(tmp_path, capsys, change, field):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**experiment(SCHEDULERS["asha"]), **change}))
    assert main(["tune", str(path), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"thrifty tune: error: {path}: {field}:") and "Traceback" not in err, err
    # a cluster given on the command line is not the file's: its problem names the option, not the file
    if field == "cluster":
        path.write_text(json.dumps(experiment(SCHEDULERS["asha"])))
        assert main(["tune", str(path), "--dry-run", "--cluster", "nonsense"]) == 2
        assert capsys.readouterr().err.startswith("thrifty tune: error: cluster: is 'nonsense'")


def test_a_trainer_that_needs_an_argument_nobody_gives_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    module = tmp_path / "needs_width.py"
    module.write_text("def make(width, lr=0.1):\n    raise AssertionError('never called')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "e.json"
    path.write_text(json.dumps(experiment(SCHEDULERS["asha"], trainer="needs_width:make",
                                          search_space={"lr": {"uniform": [0.1, 0.2]}})))
    assert main(["tune", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "trainer:" in err and "'width'" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["a-file/out", "a-file"])
def test_an_output_that_cannot_be_written_exits_2_before_the_run(tmp_path, capsys, where):
    (tmp_path / "a-file").write_text("x")
    path = tmp_path / "e.json"
    path.write_text(json.dumps(experiment(SCHEDULERS["asha"])))
    for argv, flag in ((["--out", str(tmp_path / where)], "--out"),
                       (["--out", str(tmp_path / "out"), "--plot", str(tmp_path)], "--plot")):
        with pytest.raises(SystemExit) as exited:  # argparse's usage error
            main(["tune", str(path), *argv])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and flag in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_run_that_ends_before_any_result_did_not_meet_its_goal(tmp_path, capsys):
    """A deadline too short for one result: nothing was found, so the goal is not met (exit 4), and the
    summary says so (a review found "met": true)."""
    path = tmp_path / "e.json"
    path.write_text(json.dumps(experiment(SCHEDULERS["fifo"], deadline_s=0.01)))
    assert main(["tune", str(path), "--out", str(tmp_path / "out"), "--json"]) == 4
    assert "the goal was not met: no trial reported a result" in capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["goal"]["met"] is False


def test_a_file_that_is_not_an_experiment_exits_2(tmp_path, capsys):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    assert main(["tune", str(path)]) == 2
    path.write_text("{not json")
    assert main(["tune", str(path)]) == 2
    assert main(["tune"]) == 2
    assert main(["tune", "--resume", str(tmp_path)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_the_shipped_example_is_a_valid_experiment():
    e = parse_experiment(json.loads((ROOT / "datasets" / "examples" / "tune-digits.json").read_text()))
    assert e.scheduler.name == "hypersched" and e.deadline_s is not None and e.deadline_s <= 300


def test_a_diverged_trial_s_nan_metric_is_null_in_the_summary():
    from thrifty.runtime.tuning.driver import json_safe
    from thrifty.runtime.tuning.trial import TrialState

    summary = {"best": {"metric": float("nan")}, "per_trial": [{"state": TrialState.FAILED, "last": float("inf"),
                                                                 "best": 0.5}], "results": (1, 2.5)}
    text = json.dumps(json_safe(summary), allow_nan=False)
    assert json.loads(text) == {"best": {"metric": None}, "per_trial": [{"state": "failed", "last": None, "best": 0.5}],
                                "results": [1, 2.5]}


def test_pop_learns_its_prior_from_the_trials_unless_told_not_to():
    from thrifty.runtime.tuning.experiment_file import build_scheduler

    for flag in (True, False):
        spec = parse_experiment(experiment({"name": "pop", "target": 0.9, "learn_prior": flag}))
        assert build_scheduler(spec).learn_prior is flag
    assert build_scheduler(parse_experiment(experiment({"name": "pop", "target": 0.9}))).learn_prior is True


def test_the_metric_range_reaches_pop_and_earlyterm_as_they_see_the_metric():
    from thrifty.runtime.tuning.experiment_file import build_scheduler

    def built(scheduler, **changes):
        return build_scheduler(parse_experiment(experiment(scheduler, **changes))).metric_range

    pop = {"name": "pop", "target": 0.9}
    assert built(pop) == (0.0, 1.0)                                      # max: an accuracy by default
    assert built({"name": "pop", "target": 0.3}, mode="min") == (None, 0.0)  # min: a loss >= 0, seen as -loss
    assert built({"name": "pop", "target": 2.0}, mode="min", metric_range=[1, None]) == (None, -1.0)
    assert built({"name": "earlyterm"}, metric_range=[None, None]) == (None, None)
    assert built({"name": "earlyterm"}, metric_range=[-5, 200]) == (-5.0, 200.0)
