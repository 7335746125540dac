"""``thrifty run`` tells the truth and loses nothing (issue 33): a dry run
makes every check the run makes and reports every problem at once; a fault
the run cannot have is bad input; a finished run resumed says so and appends
nothing; a run that ends badly still writes its timeline and plot; a steady
iteration time far off the prediction is said once, with the profile to
make; SIGTERM stops a run as Ctrl-C does (143) and ``--resume`` alone
restores what it was started with; the fork server leaves quietly when its
reader is gone. Real worker processes (gloo on 127.0.0.1, the tiny MLP),
few iterations, event-driven waits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from thrifty.runtime.worlds.errors import WorldFailed  # noqa: E402
from thrifty.runtime.worlds.zygote import Zygote  # noqa: E402
from thrifty.runtime.cli import EXIT_INFEASIBLE, main  # noqa: E402
from thrifty.runtime.providers.local import LocalProvider  # noqa: E402
from thrifty.runtime.training import RunConfig, SlowWorker, read_run_log, train  # noqa: E402
from thrifty.runtime.training.prediction import profile_command  # noqa: E402
from thrifty.runtime.training.monitor import ThroughputWindow, prediction_off  # noqa: E402
from thrifty.runtime.training.preflight import RunProblems  # noqa: E402

from helpers import TERMINAL_CLI  # noqa: E402
from test_run_behaviour import ROOT, TINY, _events, no_leftover_workers, write  # noqa: E402, F401
from test_training_runtime_units import demo_problem, plan_dict  # noqa: E402

AWS_CATALOG = str(ROOT / "datasets" / "catalog" / "aws-us-east-1.json")


# -- the dry run makes every check the run makes, and reports them all --------------------------

def test_dry_run_and_run_report_every_problem_at_once_and_start_nothing(tmp_path, capsys, monkeypatch):
    """A GPU plan on the local provider, a fault naming a machine the plan lacks,
    a time past the limit and a trainer that does not import: the dry run used
    to say yes (exit 0); now it and the run both list all four, one a line."""
    monkeypatch.chdir(tmp_path)
    gpu = "g4dn.xlarge"
    problem = write(tmp_path / "problem.json", demo_problem(
        catalog=AWS_CATALOG, limits={"time_s": 600},
        instances=[{"instance_type": gpu, "market": "on_demand", "quota": 2}]))
    plan = write(tmp_path / "plan.json", plan_dict((gpu, "on_demand", 1, 16)))
    args = ["run", str(plan), "--problem", str(problem), "--trainer", "no_such_module_xyz:f",
            "--inject", "kill:machine=1,iteration=5", "--inject", "kill:machine=0,time=900"]
    for extra in (["--dry-run"], []):
        assert main(args + extra) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert all(line.startswith("thrifty run: error: ") for line in lines), lines
        text = "\n".join(lines)
        assert f"but {gpu} is a 'T4' machine" in text
        assert "no_such_module_xyz" in text
        assert ("inject: kill:machine=1,iteration=5: there is no machine 1; the plan has 1 machine: "
                f"0 {gpu} (on_demand)") in text
        assert "kill:machine=0,time=900: time 900 s is at or past the run's time limit of 600 s" in text
        assert len(lines) == 4 and "Traceback" not in text
        assert not (tmp_path / "thrifty-runs").exists()  # nothing written, nothing started


def test_the_run_refuses_before_it_starts_what_its_provider_cannot_give(tmp_path):
    """train() checks the machines with the provider it is given, before it writes or starts anything."""
    problem = demo_problem(catalog=AWS_CATALOG, limits={"time_s": 600},
                           instances=[{"instance_type": "g4dn.xlarge", "market": "on_demand", "quota": 2}])
    with pytest.raises(RunProblems) as caught:
        train(plan_dict(("g4dn.xlarge", "on_demand", 1, 16)), TINY, problem=problem,
              provider=LocalProvider("t", AWS_CATALOG), run_dir=tmp_path / "run", faults=[])
    (problem_found,) = caught.value.problems
    assert str(problem_found).startswith("cluster: the local provider runs CPU worker processes, but g4dn.xlarge")
    assert not (tmp_path / "run").exists()


class _ClusterLackingLocalB:
    """What `RayProvider` says of a cluster whose nodes offer local-a only."""

    local_workers = False
    closed = False

    def check_plan(self, allocations):
        from thrifty.core.errors import ProblemError

        lacking = [f"{n} x {t} ({m}): the cluster has 0" for t, m, n in allocations if t == "local-b"]
        if lacking:
            raise ProblemError(f"the Ray cluster at 127.0.0.1:6390 lacks machines the plan needs: {'; '.join(lacking)}",
                               path="cluster")

    def close(self):
        type(self).closed = True


def test_a_dry_run_on_a_cluster_asks_the_cluster(tmp_path, capsys, monkeypatch):
    """The dry run of a plan needing local-b on a cluster of local-a nodes said
    yes (exit 0) and the run then exited 2 ("lacks machines the plan needs"):
    the dry run now gets the cluster's provider and asks it, and closes it."""
    import thrifty.runtime.cluster.spec as spec

    monkeypatch.setattr(spec, "cluster_provider", lambda cluster, run_id, catalog, preload=(): _ClusterLackingLocalB())
    problem = write(tmp_path / "problem.json", demo_problem(limits={"time_s": 600}))
    plan = write(tmp_path / "plan.json", plan_dict(("local-b", "spot", 1, 16)))
    assert main(["run", str(plan), "--problem", str(problem), "--trainer", TINY, "--cluster", "127.0.0.1:6390",
                 "--dry-run"]) == 2
    assert capsys.readouterr().err == ("thrifty run: error: cluster: the Ray cluster at 127.0.0.1:6390 lacks machines "
                                       "the plan needs: 1 x local-b (spot): the cluster has 0\n")
    assert _ClusterLackingLocalB.closed


def test_a_fault_past_the_run_is_bad_input(tmp_path, capsys):
    problem = write(tmp_path / "problem.json", demo_problem(iterations=20, limits={"time_s": 600}))
    plan = write(tmp_path / "plan.json", plan_dict(("local-a", "spot", 2, 8)))
    code = main(["run", str(plan), "--problem", str(problem), "--trainer", TINY, "--dry-run",
                 "--inject", "slow:machine=1,from=20,extra=0.1", "--inject", "kill:machine=1,iteration=19"])
    err = capsys.readouterr().err
    assert code == 2
    assert ("slow:machine=1,from=20,extra=0.1: iteration 20 is not inside the run: it has 20 iterations "
            "(a fault may name iteration 19 at most)") in err
    assert "kill:machine=1" not in err  # machine 1 exists and iteration 19 comes


# -- a finished run resumed ---------------------------------------------------------------------

def test_resuming_a_finished_run_says_so_and_runs_and_appends_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    problem = write(tmp_path / "problem.json", demo_problem(iterations=6, limits={"time_s": 3600}))
    assert main(["run", str(problem), "--trainer", TINY, "--out", "first", "--json"]) == 0
    log = (tmp_path / "first" / "run.jsonl").read_bytes()
    capsys.readouterr()
    for resume in (["--resume", "first"], ["--resume", "--out", "first"], ["--resume", "first", "--dry-run"]):
        assert main(["run", *resume]) == 0
        err = capsys.readouterr().err
        assert "first has finished: 6 iterations in" in err and "within its limits; nothing to resume" in err
        assert (tmp_path / "first" / "run.jsonl").read_bytes() == log
    # asked for more iterations, the run goes on
    more = write(tmp_path / "more.json", demo_problem(iterations=8, limits={"time_s": 3600}))
    assert main(["run", "--resume", "first", "--problem", str(more), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["iterations"] == 8


# -- what a run leaves, however it ends ---------------------------------------------------------

def test_a_run_that_ends_in_3_still_writes_its_timeline_and_plot(tmp_path, capsys):
    problem = demo_problem(iterations=30, limits={"time_s": 3600},
                           instances=[{"instance_type": "local-a", "market": "spot", "quota": 1}])
    problem = write(tmp_path / "problem.json", problem)
    plot = tmp_path / "run.png"
    code = main(["run", str(problem), "--trainer", TINY, "--out", str(tmp_path / "run"), "--checkpoint-every", "5",
                 "--inject", "kill:machine=0,iteration=12", "--plot", str(plot), "--no-progress"])
    captured = capsys.readouterr()
    assert code == EXIT_INFEASIBLE
    assert plot.exists() and plot.stat().st_size > 0
    assert "preempted local-a (spot)" in captured.err  # --no-progress: the events as plain lines
    assert "ReplanInfeasible: no machine choice is left" in captured.out  # the timeline's last line
    assert "segment 0 lost at iteration 12" in captured.out


def test_a_preemption_past_the_time_limit_goes_on_late_and_exits_4(tmp_path, capsys):
    """What the README's demo met on a busy host: the machine is lost after the
    time limit has passed, so no plan can meet it; the run used to stop there
    (exit 3, half done). It now goes on with the soonest plan within the
    budget and finishes late (exit 4, saying by how much)."""
    problem = write(tmp_path / "problem.json", demo_problem(iterations=24, limits={"time_s": 1.0}))
    plan = write(tmp_path / "plan.json", plan_dict(("local-a", "spot", 1, 16)))
    code = main(["run", str(plan), "--problem", str(problem), "--trainer", TINY, "--out", str(tmp_path / "run"),
                 "--checkpoint-every", "4", "--inject", "slow:machine=0,from=0,extra=0.1",
                 "--inject", "kill:machine=0,iteration=12", "--no-replan-on-slowdown", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 4, captured.err[-2000:]
    (replan,) = [e for e in read_run_log(tmp_path / "run" / "run.jsonl") if e["event"] == "replan"]
    assert replan["reason"] == "preemption" and replan["best_effort"].startswith("the time limit 1 s has passed")
    assert replan["problem"]["limits"]["time_s"] is None and replan["plan"]["objective"] == "min_time"
    assert "finishing late (the time limit 1 s has passed" in captured.err
    assert "finished OUTSIDE the limits: time" in captured.err
    assert "best effort, the soonest within the budget" in captured.out  # the timeline says so too
    assert f"metrics: {tmp_path / 'run' / 'metrics.jsonl'}" in captured.out  # where to look, at the end


# -- measured against predicted -----------------------------------------------------------------

def test_prediction_off_needs_a_steady_window_beyond_the_factor():
    steady = ThroughputWindow(mean=100.0, sd=2.0, bound=101.2, bins=10, span_s=1.0)  # 10 ms an iteration
    assert prediction_off(steady, 0.0159) == pytest.approx(0.010 / 0.0159)  # faster than 1/1.5 of it
    assert prediction_off(steady, 0.012) is None  # within 1.5x
    assert prediction_off(steady, 0.004) == pytest.approx(2.5)  # slower
    noisy = ThroughputWindow(mean=100.0, sd=120.0, bound=172.0, bins=10, span_s=1.0)
    assert prediction_off(noisy, 0.0159) is None  # what a warm-up or a hiccup looks like
    assert prediction_off(None, 0.0159) is None


def test_the_profile_command_names_the_trainer_s_workload():
    assert profile_command("thrifty.runtime.training.examples:zoo", {"model": "mlp"}, "cpu", 1, 2) == (
        "thrifty profile thrifty.runtime.measure.zoo:mlp --out mlp__cpu.json --name mlp --threads 1 "
        "--device cpu --colocated 2, then name that file as the problem's model")
    assert profile_command("thrifty.runtime.training.examples:zoo", {}, "cpu", 1, 1).startswith(
        "thrifty profile thrifty.runtime.measure.zoo:tiny_transformer --out tiny-transformer__cpu.json")
    assert "(MODULE:WORKLOAD returns the model of mypkg.jobs:resnet with make_batch and loss_fn)" in \
        profile_command("mypkg.jobs:resnet", {}, "cuda", 1, 1)


def test_a_run_far_off_its_prediction_says_so_once(tmp_path):
    """The plan predicts 0.5 s an iteration; the tiny MLP takes milliseconds."""
    plan = {**plan_dict(("local-a", "spot", 1, 16)),
            "predicted": {"iteration_s": 0.5, "total_s": 100.0, "cost_usd": 0.01, "total_s_p95": 100.0}}
    said = []
    from thrifty.runtime.training import Hooks

    hooks = Hooks()
    hooks.on("prediction_off", said.append)
    config = RunConfig(checkpoint_every=None, checkpoint_every_s=None, poll_s=0.02, window_s=1.0,
                       world_timeout_s=90, stall_timeout_s=90, stop_timeout_s=60, collective_timeout_s=90)
    # 20 ms more an iteration: at least 3 s of steady iterations, a full window under any load, still far
    # faster than predicted (and an injected slow-down is not blamed for a run faster than its plan)
    result = train(plan, TINY, problem=demo_problem(iterations=150, limits={"time_s": 3600}), config=config,
                   run_dir=tmp_path / "run", faults=[SlowWorker(0, 0, 0.02)], hooks=hooks)
    assert result.iterations == 150
    logged = [e for e in read_run_log(result.log_path) if e["event"] == "prediction_off"]
    assert len(said) == len(logged) == 1
    off = said[0]
    assert off.predicted_iteration_s == 0.5 and off.ratio < 1 / 1.5
    assert "smaller than the problem's model 'mlp'" in off.cause
    assert "--out tiny-mlp__cpu.json" in off.command and "MODULE:WORKLOAD" in off.command
    assert logged[0]["measured_iteration_s"] == pytest.approx(off.measured_iteration_s)


# -- SIGTERM, and --resume alone ----------------------------------------------------------------

def test_sigterm_stops_like_ctrl_c_and_resume_alone_restores_the_plot(tmp_path):
    problem = write(tmp_path / "problem.json", demo_problem(iterations=60, limits={"time_s": 3600}))
    plot = tmp_path / "run.png"
    args = [sys.executable, "-c", TERMINAL_CLI, "run", str(problem), "--trainer", TINY, "--checkpoint-every", "10",
            "--inject", "slow:machine=0,from=12,extra=0.2", "--plot", str(plot), "--json"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
    runs = tmp_path / "thrifty-runs"
    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "checkpoint" for d in (runs.iterdir() if runs.exists() else [])
                      for e in _events(d)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err.decode()
    (run_dir,) = list(runs.iterdir())
    assert proc.returncode == 143, err[-2000:]
    assert "interrupted by SIGTERM at iteration" in err and "Traceback" not in err
    assert f"resume with: thrifty run --resume {run_dir}\n" in err  # nothing else to repeat: the record has it
    interrupted = [e for e in _events(run_dir) if e["event"] == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0]["checkpoint_iteration"] >= 10
    assert plot.exists()  # drawn from what the log held
    plot.unlink()

    # --resume without a folder: the run under ./thrifty-runs/ active last; the plot comes from the record
    out = subprocess.run([sys.executable, "-c", TERMINAL_CLI, "run", "--resume", "--json", "--inject",
                          "slow:machine=0,from=59,extra=0.01"], capture_output=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert f"thrifty run: resuming {run_dir}" in out.stderr.decode()
    assert json.loads(out.stdout)["iterations"] == 60
    assert plot.exists()


# -- the fork server's pipe ---------------------------------------------------------------------

def test_the_fork_server_leaves_quietly_when_its_reader_has_gone():
    """The race behind the BrokenPipeError traceback on an early exit: the
    driver closes its end of the fork server's stdout (it exited) before the
    server writes (its ready line after importing torch, a preload's answer, a
    worker's exit). Closing the reader first makes the write fail every time."""
    proc = subprocess.Popen([sys.executable, "-m", "thrifty.runtime.worlds.zygote_main"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdout.close()  # the reader is gone before anything was written
        proc.stdin.write(b'{"preload": ["json"]}\n')  # answered after the ready line: a write to a closed pipe
        proc.stdin.flush()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert b"Traceback" not in err and b"BrokenPipeError" not in err, err.decode()[-2000:]


def test_a_request_to_a_fork_server_that_has_gone_is_a_world_failure():
    zygote = Zygote()
    try:
        zygote.proc.kill()
        zygote.proc.wait()
        with pytest.raises(WorldFailed, match="the worker fork server has exited"):
            zygote.launch("thrifty.runtime.worlds.rank:main", [], {}, os.devnull)
    finally:
        zygote.close()


def write_here(argv: list[str]) -> None:
    """A worker entry for the test below: writes the file named by a relative path."""
    with open(argv[0], "w") as f:
        f.write("here")
    os._exit(0)


def test_a_worker_sees_relative_paths_from_the_caller_s_folder(tmp_path, monkeypatch):
    """`--out first` is relative: the fork server, started in another folder
    earlier in this process, forked workers that looked for it there and
    died (exit 70) before they wrote a log, and every machine looked lost."""
    zygote = Zygote()
    try:
        monkeypatch.chdir(tmp_path)  # after the fork server started
        worker = zygote.launch("test_run_honesty:write_here", ["written.txt"], {}, "worker.log",
                               sys_path=[str(Path(__file__).parent)])
        worker.join(60)
        assert worker.exitcode == 0
        assert (tmp_path / "written.txt").read_text() == "here" and (tmp_path / "worker.log").exists()
    finally:
        zygote.close()
