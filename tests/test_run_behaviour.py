"""The training runtime's everyday behaviour, with real worker processes
(gloo on 127.0.0.1, the tiny float64 MLP): the exit codes of a run past its
limits and of one a preemption leaves without a plan, a monitor window that
fits a short job (a rate and an ETA, a re-plan on a persistent slowdown),
Ctrl-C and ``--resume RUN_DIR`` with the time and money already spent, loss
and metrics in the log, and `train()` taking what the command line takes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")

from thrifty.runtime.cli import EXIT_INFEASIBLE, EXIT_OUTSIDE_LIMITS, main  # noqa: E402
from thrifty.runtime.training import ProgressMonitor, RunConfig, SlowWorker, read_run_log, train  # noqa: E402
from thrifty.runtime.training.driver import resumed_prediction  # noqa: E402
from thrifty.runtime.training.replan import slowdown_hold_off_s  # noqa: E402
from thrifty.runtime.training.monitor import WINDOW_MAX_S, WINDOW_MIN_S, auto_window_s  # noqa: E402
from thrifty.runtime.training.plans import as_plan, run_plan  # noqa: E402
from thrifty.runtime.training.rundir import RunRecord, carried_over  # noqa: E402
from thrifty.solver.problem import parse_problem  # noqa: E402

from helpers import TERMINAL_CLI  # noqa: E402
from test_training_runtime_processes import worker_pids  # noqa: E402
from test_training_runtime_units import demo_problem, plan_dict  # noqa: E402

TINY = "thrifty.runtime.training.examples:tiny_mlp"
ROOT = Path(__file__).resolve().parents[1]
QUICK = dict(checkpoint_every=10, checkpoint_every_s=None, poll_s=0.02, world_timeout_s=90, stall_timeout_s=90,
             stop_timeout_s=60, collective_timeout_s=90)


@pytest.fixture(autouse=True)
def no_leftover_workers():
    yield
    assert worker_pids() == []


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_a_run_past_its_limits_exits_4_and_says_by_how_much(tmp_path, capsys):
    problem = write(tmp_path / "problem.json",
                    demo_problem(iterations=30, limits={"time_s": 1.5, "cost_usd": 1e-6}))
    plan = write(tmp_path / "plan.json", plan_dict(("local-a", "spot", 1, 16)))
    code = main(["run", str(plan), "--problem", str(problem), "--trainer", TINY, "--run-dir", str(tmp_path / "run"),
                 "--inject", "slow:machine=0,from=0,extra=0.06", "--no-replan-on-slowdown", "--json"])
    captured = capsys.readouterr()
    assert code == EXIT_OUTSIDE_LIMITS == 4
    result = json.loads(captured.out)
    assert not result["within_limits"] and result["elapsed_s"] > 1.5 and result["cost_usd"] > 1e-6
    over_s, over_usd = result["elapsed_s"] - 1.5, result["cost_usd"] - 1e-6
    assert (f"OUTSIDE the limits: time {result['elapsed_s']:,.1f} s > limit 1.5 s (+{over_s:,.1f} s); "
            f"cost ${result['cost_usd']:,.4f} > budget $1e-06 (+${over_usd:,.4f})") in captured.err
    finish = [e for e in read_run_log(tmp_path / "run" / "run.jsonl") if e["event"] == "finish"][0]
    assert finish["iterations"] == 30 and not finish["within_limits"]


def test_a_preemption_that_leaves_no_plan_exits_3_and_says_how_to_go_on(tmp_path, capsys):
    problem = demo_problem(iterations=30, limits={"time_s": 3600},
                           instances=[{"instance_type": "local-a", "market": "spot", "quota": 1}])
    problem = write(tmp_path / "problem.json", problem)
    run_dir = tmp_path / "run"
    code = main(["run", str(problem), "--trainer", TINY, "--run-dir", str(run_dir), "--checkpoint-every", "5",
                 "--inject", "kill:machine=0,iteration=12", "--json"])
    err = capsys.readouterr().err
    assert code == EXIT_INFEASIBLE
    assert "infeasible after re-planning: no machine choice is left: depleted local-a (spot)" in err
    assert f"the checkpoint at iteration 10 is kept; resume with: thrifty run --resume {run_dir}" in err


def test_the_window_scales_with_the_job() -> None:
    assert auto_window_s(30.0, 25.0) == pytest.approx(2.5)  # a tenth of the shorter
    assert auto_window_s(None, 100_000.0) == WINDOW_MAX_S  # Srifty's K for long jobs
    assert auto_window_s(5.0, None) == WINDOW_MIN_S
    assert auto_window_s(60.0, None, iteration_s=1.0) == pytest.approx(20.0)  # two iterations a bin
    problem = parse_problem(demo_problem(limits={"time_s": 30}))
    plan = plan_dict(("local-a", "spot", 1, 16))
    plan["predicted"]["total_s"] = 28.0
    assert RunConfig().window_for(as_plan(plan), problem) == pytest.approx(2.8)
    assert RunConfig(window_s=300).window_for(as_plan(plan), problem) == 300


def test_after_a_call_for_a_re_plan_the_monitor_keeps_measuring_and_holds_off() -> None:
    monitor = ProgressMonitor(100, time_limit_s=5.0, cost_limit_usd=None, start=0.0, window_s=2.0, bins=4)
    reports = iter((k / 10, k // 2) for k in range(1000))  # 5 iterations a second: 20 s for 100, limit 5 s
    report = next(reports)

    def check(now: float):
        nonlocal report
        while report[0] <= now + 1e-9:
            monitor.observe(*report)
            report = next(reports)
        return monitor.check(now, [])

    assert check(2.5).violation == ("time",)
    assert check(3.0).replan  # certain for a bin (0.5 s)
    monitor.hold_off(3.0, 2.0)
    during = check(4.0)
    assert during.window is not None and during.projected_total_s is not None  # the bar keeps rate and ETA
    assert during.violation == ("time",) and not during.replan
    assert not check(5.2).replan  # after the hold the violation is seen afresh ...
    assert check(5.7).replan  # ... and held for a bin
    # re-plans that change nothing are asked for again later and later, up to 8 windows apart
    assert [slowdown_hold_off_s(2.0, k) for k in (1, 2, 3, 4, 5, 9)] == [2.0, 4.0, 8.0, 16.0, 16.0, 16.0]


def test_a_persistent_slowdown_in_a_short_job_re_plans_and_the_bar_keeps_its_rate(tmp_path):
    """The plan promises 100 iterations within 8 s; from iteration 5 to 45 the
    worker sleeps 0.1 s an iteration. With the automatic window (2 s here, not
    Srifty's 300 s) the monitor sees, about 2.3 s into the slowdown, that at
    this rate the limit will be missed (about 8.8 s after the launch) and
    re-solves while time is left; the progress it reports shows a rate and
    an ETA, also right after the slowdown."""
    snapshots = []
    result = train(plan_dict(("local-a", "spot", 1, 16)), TINY, run_dir=tmp_path,
                   problem=demo_problem(iterations=100, limits={"time_s": 8}), config=RunConfig(**QUICK),
                   faults=[SlowWorker(0, 5, 0.1, until_iteration=45)], on_progress=snapshots.append)
    events = read_run_log(result.log_path)
    assert events[0]["window_s"] == WINDOW_MIN_S
    kinds = [e["event"] for e in events]
    assert "slowdown" in kinds
    assert {"replan", "replan_kept", "replan_infeasible"} & set(kinds)
    assert result.iterations == 100
    slowdown_at = next(e["elapsed_s"] for e in events if e["event"] == "slowdown")
    after = [s for s in snapshots if s.elapsed_s > slowdown_at and s.state == "training"][:5]
    rated = [s for s in snapshots if s.window is not None and s.eta_s is not None]
    assert rated and after and all(s.window is not None and s.eta_s is not None for s in after)
    metrics = [e for e in events if e["event"] == "metrics"]  # the trainer's loss and accuracy
    assert metrics and all(e["loss"] > 0 and 0 <= e["metrics"]["accuracy"] <= 1 for e in metrics)


def test_ctrl_c_logs_the_true_iteration_and_resume_carries_time_and_cost(tmp_path):
    """Ctrl-C in a terminal: SIGINT to the whole foreground process group
    (the `thrifty run` process and its workers, which leave it to the driver);
    then, as ``timeout`` does, the same SIGINT once more to the process: one
    interruption, and the workers checkpoint where they stop (after the slow
    iteration under way, not killed in it)."""
    problem = write(tmp_path / "problem.json", demo_problem(iterations=150, limits={"time_s": 3600}))
    run_dir = tmp_path / "run"
    args = [sys.executable, "-c", TERMINAL_CLI, "run", str(problem), "--trainer", TINY, "--run-dir", str(run_dir),
            "--checkpoint-every", "10", "--inject", "slow:machine=0,from=27,extra=0.4", "--json",
            "--no-replan-on-slowdown"]  # the slow machine stays: a re-plan off it would finish the run at once
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "checkpoint" and e["iteration"] >= 30 for e in _events(run_dir)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.05)
        # how the driver stands to signals when it is interrupted, and how far it is: said if it then runs on
        running, signals = proc.poll() is None, _signal_state(proc.pid)
        reached_when_sent = _events(run_dir)[-1]
        saved_before = max(e["iteration"] for e in _events(run_dir) if e["event"] == "checkpoint")
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.15)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    err = err.decode()
    assert proc.returncode == 130, (f"running when interrupted: {running}; its signals: {signals}; its log's last "
                                    f"event then: {reached_when_sent}\n{err[-2000:]}")
    assert "Traceback" not in err and f"resume with: thrifty run --resume {run_dir}" in err
    first = read_run_log(run_dir / "run.jsonl")
    interrupted = [e for e in first if e["event"] == "interrupted"][0]
    reached = max(e["iteration"] for e in first if e["event"] == "checkpoint")
    assert interrupted["iteration"] >= reached >= 30  # the true iteration, not 0
    assert interrupted["checkpoint_iteration"] == reached == interrupted["iteration"] > saved_before
    assert f"at iteration {interrupted['iteration']} (checkpoint at {reached})" in err
    spent_s, spent_usd = interrupted["elapsed_s"], interrupted["spent_usd"]
    assert spent_usd > 0

    # --resume RUN_DIR alone: plan, problem and trainer come from the run record
    assert main(["run", "--resume", str(run_dir), "--json"]) == 0
    events = read_run_log(run_dir / "run.jsonl")
    start = [e for e in events if e["event"] == "start"][-1]
    assert start["resumed"] and start["start_iteration"] == reached
    assert start["carried_s"] >= spent_s - 1e-6 and start["carried_usd"] >= spent_usd - 1e-9
    assert start["predicted_total_s"] > spent_s  # the plan's prediction counts the first session too
    finish = [e for e in events if e["event"] == "finish"][-1]
    assert finish["iterations"] == 150
    assert finish["elapsed_s"] > spent_s and finish["cost_usd"] > spent_usd
    # the resumed session's world is segment 1: the first session's job file and worker logs are kept
    assert [e["segment"] for e in events if e["event"] == "launch"] == [0, 1]
    assert {p.name for p in (run_dir / "logs").iterdir()} == {"segment0-rank0.log", "segment1-rank0.log"}


def _signal_state(pid: int) -> str:
    """The blocked, ignored and caught signal masks of process `pid` (Linux), for a failure's message."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as e:
        return f"unreadable ({e})"
    return ", ".join(line.replace("\t", " ") for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


def _events(folder: Path) -> list[dict]:
    try:
        return read_run_log(folder / "run.jsonl")
    except Exception:  # noqa: BLE001 - not there yet, or a line half written
        return []


def test_a_resumed_run_takes_its_plan_and_problem_from_its_record_unless_given(tmp_path):
    plan, problem = plan_dict(("local-a", "spot", 1, 16)), demo_problem(limits={"time_s": 60})
    record = RunRecord(run_id="r", plan=plan, problem=problem, trainer=TINY, trainer_args={}, config={})
    got = run_plan(None, None, record, tmp_path)
    assert got.plan.config == "1xlocal-a@16" and got.problem.limits.time_s == 60
    # new limits for the rest of the run: the record's plan with the problem given
    got = run_plan(None, demo_problem(limits={"time_s": 120}), record, tmp_path)
    assert got.problem.limits.time_s == 120
    # another plan without a problem: the record's problem
    got = run_plan(plan_dict(("local-b", "spot", 1, 16)), None, record, tmp_path)
    assert got.plan.config == "1xlocal-b@16" and got.problem.limits.time_s == 60
    # a problem alone: solved, the record's problem left out
    got = run_plan(demo_problem(limits={"time_s": 90}), None, record, tmp_path)
    assert got.plan.feasible and got.problem.limits.time_s == 90
    # what earlier sessions spent and how many worlds they ran, from the run log
    log = [{"event": "start", "elapsed_s": 0.0}, {"event": "launch", "segment": 0, "elapsed_s": 0.1},
           {"event": "interrupted", "elapsed_s": 5.0, "spent_usd": 0.02},
           {"event": "start", "resumed": True, "elapsed_s": 5.0, "carried_usd": 0.02},
           {"event": "launch", "segment": 1, "elapsed_s": 5.1}, {"event": "throughput", "elapsed_s": 7.5}]
    carried = carried_over(log)
    assert (carried.seconds, carried.usd, carried.segments) == (7.5, 0.02, 2)
    # its plan's prediction as totals of the whole run: 1 s launch + 50 iterations x 0.1 s, at $0.01 / 10 s
    predicted = as_plan({**plan, "predicted": {"iteration_s": 0.1, "total_s": 10.0, "cost_usd": 0.01,
                                               "total_s_p95": 10.0}})
    assert resumed_prediction(predicted, 50, 1.0, 7.5, 0.02) == pytest.approx((13.5, 0.026))


def test_train_takes_a_yaml_problem_alone_and_writes_under_thrifty_runs(tmp_path, monkeypatch):
    problem = tmp_path / "problem.yaml"
    problem.write_text(yaml.safe_dump(demo_problem(iterations=12, limits={"time_s": 3600})))
    monkeypatch.chdir(tmp_path)
    previous = os.umask(0o022)
    try:
        result = train(str(problem), TINY, config=RunConfig(**QUICK))
    finally:
        os.umask(previous)
    assert result.iterations == 12 and result.within_limits
    assert result.run_dir.parent == tmp_path / "thrifty-runs"
    assert (result.run_dir / "run.json").exists()
    for name in ("checkpoint.pt", "run.json", "run.jsonl"):
        assert (result.run_dir / name).stat().st_mode & 0o777 == 0o644, name
    assert "thrifty-runs/" in (ROOT / ".gitignore").read_text().split()
