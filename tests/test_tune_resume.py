"""`thrifty tune --resume` after every way a run ends, for every loop scheduler.

In process (simulated trials on a virtual clock, so each case costs
milliseconds): a run recorded as `thrifty tune` records it (`RecordingExecutor`
into an event log) ends in one of the ways a real run ends: asked to stop
(Ctrl-C and SIGTERM ask the loop the same way), killed (SIGKILL: the log cut
at any line), crashed (an exception out of the driver) or at its end; then a
fresh scheduler resumes it from the log (`read_history`), and the tests check
that nothing the first run finished is done again: no finished trial is
launched again, no recorded iteration that the resume keeps is reported again
(after a graceful stop or the end, none at all), and the clock carries on.

With real processes (`thrifty tune` as a subprocess on the tuning runtime's
small example trainer, a few tenths of a second an iteration): a run is
ended in four ways (Ctrl-C, SIGTERM, SIGKILL, a crash) once it has recorded
a few results (waits watch events.jsonl, no fixed sleeps), resumed with
``--resume``, and checked the same way from its events file and summary;
the fifth way, its end, is the resumed run's own: a resume of a run that
ended says so and changes nothing.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from thrifty.runtime.cli import main
from thrifty.runtime.tuning import (ASHA, FIFO, POP, Bandit, ConfigList, EarlyTerm, HyperSched, SimulatedExecutor,
                                    SyntheticWorkload, run_experiment)
from thrifty.runtime.tuning.schedulers.bandit import action_elimination_continues
from thrifty.runtime.tuning.record import EventLog, RecordingExecutor, read_events, read_history
from thrifty.runtime.tuning.trial import ENDED, Report, Trial, TrialState

from helpers import CLI, TERMINAL, TERMINAL_CLI

ROOT = Path(__file__).resolve().parent.parent


# --- in process: every scheduler, every ending ------------------------------------------------

class FakeForecast:
    """Linear extrapolation with a Gaussian band (POP and EarlyTerm need a forecaster; the real one is slow)."""

    def __init__(self, values):
        self.n, self.last = len(values), values[-1]
        self.slope = (values[-1] - values[0]) / (len(values) - 1) if len(values) > 1 else 0.0

    def prob_at_least(self, y, epoch):
        mean = min(1.0, self.last + self.slope * (epoch - self.n))
        return 0.5 * math.erfc((y - mean) / ((0.02 + 0.01 * max(epoch - self.n, 0)) * math.sqrt(2)))


def fake_forecaster(epochs, values, max_epoch, *, seed=0, **range_):
    return FakeForecast(list(values))


SCHEDULERS: dict[str, Callable[[], object]] = {
    "fifo": FIFO,
    "asha": lambda: ASHA(min_iterations=1, eta=2),
    # cooldown 1: trials resize, so the replay sees suspends and relaunches on other atoms
    "hypersched": lambda: HyperSched(min_iterations=1, eta=2, cooldown=1, scaling="LINEAR"),
    "pop": lambda: POP(0.95, boundary=2, forecaster=fake_forecaster, min_confidence=0.0, learn_prior=False),
    "bandit": lambda: Bandit(boundary=2),
    "earlyterm": lambda: EarlyTerm(boundary=2, forecaster=fake_forecaster),
}
# later configurations score lower, so that ASHA and HyperSched promote paused trials (replays of promotions)
CONFIGS = [{"b0": 0.05 + 0.1 * (i % 3), "b1": 1.0 - 0.12 * i, "b2": (i * 0.61) % 1} for i in range(8)]
MAX_ITERATIONS, ATOMS, DEADLINE = 8, 3, 1000.0


class Crashed(RuntimeError):
    """The driver's own failure, in the middle of a run."""


def session_ending(stop_after: int | None, crash_after: int | None):
    """The recorder's `on_event` and the run's `stop` of a session asked to stop (as Ctrl-C asks) after
    `stop_after` results, or whose driver fails after `crash_after`."""
    seen, stop_reason = {"results": 0}, {"reason": None}

    def on_event(event):
        if event["event"] == "result":
            seen["results"] += 1
            if seen["results"] == stop_after:
                stop_reason["reason"] = "interrupted"
            if seen["results"] == crash_after:
                raise Crashed("the driver failed")

    return on_event, lambda: stop_reason["reason"]


def record(log_path: Path, name: str, *, resume=None, stop_after: int | None = None,
           crash_after: int | None = None, durable: bool = False, checkpoint_every: int | None = None):
    """One session of a recorded run (as `thrifty tune` records it), resumed from `resume` if given: asked to
    stop after `stop_after` results of this session, or crashing after `crash_after`; `durable`: every
    result checkpointed (as the world executor does), else only suspends checkpoint (or every
    `checkpoint_every` results)."""
    log = EventLog(log_path)
    executor = SimulatedExecutor(SyntheticWorkload(step_s=1.0), startup_s=0.5,
                                 checkpoint_every=1 if durable else checkpoint_every)
    on_event, stop = session_ending(stop_after, crash_after)
    recorder = RecordingExecutor(executor, log, t0=executor.clock.now() - (resume.elapsed_s if resume else 0.0),
                                 on_event=on_event)
    space = ConfigList(CONFIGS)
    for _ in range(len(resume.trials) if resume is not None else 0):  # past the configurations already drawn
        space.next_config()
    try:
        return run_experiment(SCHEDULERS[name](), recorder, space, total_atoms=ATOMS,
                              max_iterations=MAX_ITERATIONS, deadline=DEADLINE, resume=resume,
                              keep_checkpoints=True, stop=stop)
    finally:
        log.close()


def results_of(events):
    return [(e["trial"], e["iteration"]) for e in events if e["event"] == "result"]


def check_resumed(before: list[dict], after: list[dict], *, graceful: bool) -> None:
    """Nothing finished is done again, and the clock carries on (see the module docstring)."""
    kept = read_history(before, MAX_ITERATIONS)
    ended = {t.trial_id for t in kept.trials if t.state in ENDED}
    assert not any(e["trial"] in ended for e in after if e["event"] == "launch")   # finished trials stay so
    again = set(results_of(after)) & {(r.trial_id, r.iteration) for r in kept.results}
    assert not again                                                               # no kept iteration redone
    if graceful:
        assert not set(results_of(after)) & set(results_of(before))                # nothing at all redone
    if after and before:
        assert min(e["t"] for e in after) >= max(e["t"] for e in before) - 1e-6    # the clock carries
    final = read_history(before + after, MAX_ITERATIONS)   # every configuration tried, none left running
    assert len(final.trials) == len(CONFIGS) and not final.running
    assert all(t.state in ENDED or t.state == TrialState.PAUSED for t in final.trials)


def resume_and_check(log: Path, name: str, durable: bool = False) -> None:
    """Resume the run recorded in `log` (killed or crashed) and check it: with durable iterations, no
    result at all is done again, as after a graceful stop."""
    before = read_events(log)
    record(log, name, resume=read_history(before, MAX_ITERATIONS), durable=durable)
    check_resumed(before, read_events(log)[len(before):], graceful=durable)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_resumes_a_run_stopped_as_ctrl_c_or_sigterm_stops_it(tmp_path, name):
    stopped_running = 0
    for stop_after in range(2, 30, 3):
        log = tmp_path / f"events-{stop_after}.jsonl"
        first = record(log, name, stop_after=stop_after)
        before = read_events(log)
        if first.end_reason != "interrupted":  # it ended before
            continue
        # the trials running at the stop finished their iteration and were checkpointed there
        paused = [t for t in first.trials if t.interrupted]
        assert all(t.state == TrialState.PAUSED and t.checkpoint["iteration"] == t.iteration for t in paused)
        history = read_history(before, MAX_ITERATIONS)
        assert set(history.running) == {t.trial_id for t in paused}
        stopped_running += len(paused)
        assert record(log, name, resume=history).end_reason == "exhausted"
        after = read_events(log)[len(before):]
        check_resumed(before, after, graceful=True)
        # the trials that were running go on first, from the iteration they had reached
        relaunched = [e for e in after if e["event"] == "launch"][:len(paused)]
        assert {(e["trial"], e["from_iteration"]) for e in relaunched} == {(t.trial_id, t.iteration) for t in paused}
    assert stopped_running


@pytest.mark.parametrize("durable", [False, True], ids=["checkpoint-on-pause", "durable"])
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_resumes_a_run_killed_at_any_line(tmp_path, name, durable):
    whole = tmp_path / "whole.jsonl"
    record(whole, name, durable=durable)
    lines = whole.read_text().splitlines(keepends=True)
    whole_events = read_events(whole)
    for cut in range(3, len(lines), 2 if durable else 5):   # SIGKILL leaves every line before the kill
        log = tmp_path / f"cut{cut}.jsonl"
        log.write_text("".join(lines[:cut]))
        resume_and_check(log, name, durable)
        if durable:
            check_decisions_carried_out(whole_events, cut, read_events(log)[cut:])


def test_results_newer_than_the_last_checkpoint_are_dropped_listed_and_trained_again(tmp_path):
    # checkpoint_every 2: a run killed after an odd iteration's result goes back to the even one before it
    whole = tmp_path / "whole.jsonl"
    record(whole, "fifo", checkpoint_every=2)
    events = read_events(whole)
    cut = next(i for i, e in enumerate(events) if e["event"] == "result" and e["iteration"] == 3) + 1
    tid = events[cut - 1]["trial"]
    log = tmp_path / "cut.jsonl"
    log.write_text("".join(json.dumps(e) + "\n" for e in events[:cut]))
    history = read_history(events[:cut], MAX_ITERATIONS)
    assert history.dropped == {tid: (3, 3)} and history.trials[tid].iteration == 2
    record(log, "fifo", resume=history, checkpoint_every=2)
    after = read_events(log)[cut:]
    assert set(results_of(after)) & set(results_of(events[:cut])) == {(tid, 3)}   # only the dropped one again


def check_decisions_carried_out(whole: list[dict], cut: int, after: list[dict]) -> None:
    """A run killed after a trial's result and before the scheduler's answer to it was carried out (`cut`
    lines of the `whole` run kept): the resumed run carries out that answer (the same scheduler, rebuilt,
    answers the same): a stop or pause comes first for that trial, and nothing goes past max_iterations."""
    assert all(e["iteration"] <= MAX_ITERATIONS for e in after if e["event"] == "result")
    last: dict[int, dict] = {}
    for e in whole[:cut]:
        last[e["trial"]] = e
    for tid, e in last.items():
        if e["event"] != "result":
            continue
        answers = [n for n in whole[cut:] if n["trial"] == tid][:2]
        if not answers or answers[0]["event"] not in ("terminate", "suspend") or answers[0].get("interrupted"):
            continue
        answer = answers[0]
        if answer["event"] == "suspend" and len(answers) > 1 and answers[1]["event"] == "launch" \
                and answers[1]["t"] == answer["t"]:
            continue  # a resize: the trial goes on
        first = next(n for n in after if n["trial"] == tid)
        assert (first["event"], first["iteration"]) == (answer["event"], answer["iteration"]), (tid, cut)


@pytest.mark.parametrize("durable", [False, True], ids=["checkpoint-on-pause", "durable"])
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_resumes_a_run_whose_driver_crashed(tmp_path, name, durable):
    log = tmp_path / "events.jsonl"
    for crash_after in (4, 7, 11):
        log = tmp_path / f"events-{crash_after}.jsonl"
        with pytest.raises(Crashed):
            record(log, name, crash_after=crash_after, durable=durable)
        resume_and_check(log, name, durable)


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_scheduler_resumes_a_run_that_ended_without_doing_anything(tmp_path, name):
    log = tmp_path / "events.jsonl"
    first = record(log, name)
    assert first.end_reason == "exhausted"
    before = read_events(log)
    second = record(log, name, resume=read_history(before, MAX_ITERATIONS))
    assert second.end_reason == "exhausted" and read_events(log) == before


def test_a_promoted_trial_is_in_no_lower_rung_s_queue_after_a_resume(tmp_path):
    # ASHA pauses trial 0 at rung 1, promotes it later; a replay that skipped the promotion (the launch) left it
    # in rung 1's queue and asked to start it again while it ran ("ASHA asked to start trial 0, which is running")
    log = tmp_path / "events.jsonl"
    record(log, "asha")
    events = read_events(log)
    promoted = {e["trial"] for e in events if e["event"] == "launch" and e["from_iteration"] > 0}
    assert promoted
    cut = max(i for i, e in enumerate(events) if e["event"] == "launch" and e["trial"] in promoted) + 1
    (tmp_path / "cut.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events[:cut]))
    resume_and_check(tmp_path / "cut.jsonl", "asha")


# --- in process: a RubberBand plan, stopped, killed or crashed, then resumed ------------------

def plan_problem():
    from thrifty.solver.problem import parse_problem

    return parse_problem({"kind": "tuning", "experiment": {"algorithm": "sha", "trials": 8, "min_iters": 1,
                                                          "max_iters": 7, "eta": 2},
                          "model": "resnet50", "instance_type": "p3.8xlarge", "deadline_s": 60,
                          "billing": "per_instance", "cloud": {"scale_latency_s": 5, "init_latency_s": 10},
                          "samples": 60, "name": "sha8"})


def plan_session(log_path: Path, plan, *, resume=None, stop_after: int | None = None,
                 crash_after: int | None = None):
    """One session of a recorded RubberBand plan run on the simulated backend (each iteration checkpointed),
    as `thrifty tune` records it; resumed from `resume`, stopped after or crashing at `stop_after` /
    `crash_after` results of this session."""
    from thrifty.runtime.tuning import synthetic_search_space
    from thrifty.runtime.tuning.executors.plan import execute_plan, recorded_cost_usd, simulated_backend

    earlier = recorded_cost_usd(read_events(log_path)) if resume is not None else 0.0
    backend = simulated_backend(plan_problem(), seed=1)
    backend.executor.checkpoint_every = 1
    on_event, stop = session_ending(stop_after, crash_after)
    log = EventLog(log_path)
    recorder = RecordingExecutor(backend.executor, log, on_event=on_event,
                                 t0=backend.clock.now() - (resume.elapsed_s if resume else 0.0))
    space = synthetic_search_space(seed=3)
    for _ in range(len(resume.trials) if resume is not None else 0):
        space.next_config()
    try:
        return execute_plan(plan, recorder, backend.provider, space, stage_hook=backend.stage_hook,
                            catalog=backend.provider.catalog, min_billed_s=backend.min_billed_s, resume=resume,
                            stop=stop, earlier_cost_usd=earlier)
    finally:
        log.close()


@pytest.fixture(scope="module")
def sha_plan():
    from thrifty.solver.solve import solve_tuning

    plan = solve_tuning(plan_problem())
    assert plan.feasible and [s.trials for s in plan.stages] == [8, 4, 2]
    return plan


def check_plan_resumed(whole, before: list[dict], after: list[dict], resumed) -> None:
    """The resumed plan run ends as the uninterrupted one (`whole`): the same trials in each stage, the same
    survivor, each trial trained to the same iteration; no recorded iteration trained again, no finished
    stage run again; the clock and the cost carry on."""
    assert resumed.stopped is None
    assert [r.trial_ids for r in resumed.stages] == [r.trial_ids for r in whole.stages]
    assert [(t.trial_id, t.iteration, t.state) for t in resumed.trials] == \
        [(t.trial_id, t.iteration, t.state) for t in whole.trials]
    assert resumed.best_trial_id == whole.best_trial_id
    assert not set(results_of(after)) & set(results_of(before))
    reached = {}
    for e in before:
        if e["event"] == "result":
            reached[e["trial"]] = e["iteration"]
    target = 0
    for record in resumed.stages:  # a stage whose trials had all trained before is not run again
        target += record.iters_per_trial  # one bracket: its trials' iterations by the stage's end
        assert record.done_before == all(reached.get(t, 0) >= target for t in record.trial_ids)
        assert not record.done_before or not record.machines
    assert min((e["t"] for e in after), default=math.inf) >= max(e["t"] for e in before) - 1e-6
    assert resumed.jct_s >= max(e["t"] for e in before)
    assert resumed.cost_usd > sum(m.cost_usd(min_billed_s=60.0) for m in resumed.machines)  # the earlier session's


@pytest.mark.parametrize("ending", ["stop", "crash", "kill"])
def test_a_plan_run_resumes_after_it_is_stopped_crashes_or_is_killed(tmp_path, sha_plan, ending):
    whole = plan_session(tmp_path / "whole.jsonl", sha_plan)
    lines = (tmp_path / "whole.jsonl").read_text().splitlines(keepends=True)
    total = len(results_of(read_events(tmp_path / "whole.jsonl")))
    points = range(3, total, 4) if ending != "kill" else range(5, len(lines) - 1, 3)
    for n in points:
        log = tmp_path / f"{ending}-{n}.jsonl"
        if ending == "stop":
            first = plan_session(log, sha_plan, stop_after=n)
            assert first.stopped == "interrupted"
            assert all(t.state != TrialState.RUNNING for t in first.trials)
        elif ending == "crash":
            with pytest.raises(Crashed):
                plan_session(log, sha_plan, crash_after=n)
        else:
            log.write_text("".join(lines[:n]))
        before = read_events(log)
        resumed = plan_session(log, sha_plan, resume=read_history(before, 7))
        check_plan_resumed(whole, before, read_events(log)[len(before):], resumed)


# --- scheduler rules for any sign of score ----------------------------------------------------

def test_bandit_keeps_the_best_job_whatever_the_sign_of_the_scores():
    # the paper's rule on raw negative scores stops the best job itself: -2 * 1.5 = -3 < -2
    assert action_elimination_continues(-2.0, -2.0, 0.5, r_min=-10.0)
    # on the normalised scale (zero at the worst score): (-4 + 10) * 1.5 = 9 > 8 = -2 + 10 goes on ...
    assert action_elimination_continues(-4.0, -2.0, 0.5, r_min=-10.0)
    # ... (-6 + 10) * 1.5 = 6 < 8 stops; the same as the paper's rule on scores shifted by +10
    assert not action_elimination_continues(-6.0, -2.0, 0.5, r_min=-10.0)
    assert action_elimination_continues(-6.0, -2.0, 0.5, r_min=-10.0) == action_elimination_continues(4.0, 8.0, 0.5)


def bandit_run(scores: list[float], lower: float | None) -> dict[int, str]:
    """Each trial reports its constant score for 4 iterations, Bandit(boundary 2) judging; the final states."""
    class Constant:
        def metric(self, config, iteration):
            return config["q"]

        def iteration_s(self, config, iteration, atoms):
            return 1.0

    result = run_experiment(Bandit(boundary=2, lower=lower), SimulatedExecutor(Constant()),
                            ConfigList([{"q": q} for q in scores]), total_atoms=len(scores), max_iterations=4)
    return {t.trial_id: t.state.value for t in result.trials}


@pytest.mark.parametrize("shift", [0.0, -100.0, -0.5])
def test_bandit_judges_losses_and_negative_rewards_as_it_judges_accuracies(shift):
    # accuracies 0.9, 0.7, 0.5, 0.2 on [0, 1]: 0.5 * 1.5 = 0.75 < 0.9 and 0.2 * 1.5 < 0.9 stop, 0.7 * 1.5 goes on;
    # the same scores shifted below 0 (a reward, or -loss under mode: min) with the range shifted alike
    # keep the same trials, the best included (the raw rule stopped every one of them)
    states = bandit_run([q + shift for q in (0.9, 0.7, 0.5, 0.2)], lower=shift)
    assert states == {0: "completed", 1: "completed", 2: "terminated", 3: "terminated"}


def test_bandit_without_a_lower_bound_measures_from_the_lowest_score_seen():
    # a loss under mode: min (scores -loss, no lower side): the best trial and those close to it go on
    states = bandit_run([-0.3, -0.35, -2.0, -5.0], lower=None)
    assert states[0] == "completed" and states[1] == "completed" and states[3] == "terminated"


def test_a_bandit_experiment_with_mode_min_keeps_its_best_trial():
    from thrifty.runtime.tuning.experiment_file import build_scheduler, parse_experiment

    e = parse_experiment({"trainer": "thrifty.runtime.tuning.executors.worlds:example_trainer",
                          "search_space": {"lr": {"choice": [0.1]}}, "samples": 1, "metric": "loss", "mode": "min",
                          "max_iterations": 4, "scheduler": {"name": "bandit", "boundary": 2},
                          "resources": {"atoms": 1}})
    bandit = build_scheduler(e)
    assert isinstance(bandit, Bandit) and bandit.lower is None  # a loss has no lower side as a score (-loss)
    trial = Trial(0, {})
    for i, loss in enumerate((2.0, 1.5), 1):
        trial.metrics.append(e.score(loss))
        decision = bandit.on_result(trial, Report(0, i, e.score(loss), 1.0, 1, float(i)))
    assert decision.value == "continue"


# --- with real processes: `thrifty tune`, interrupted five ways, then resumed --------------------

EXAMPLE = "thrifty.runtime.tuning.executors.worlds:example_trainer"


def experiment_file(tmp_path: Path, scheduler: dict) -> Path:
    spec = {"name": "resume", "trainer": EXAMPLE, "search_space": {"lr": {"loguniform": [0.01, 0.5]}},
            "trainer_args": {"samples": 2048, "hidden": 16}, "samples": 4, "seed": 3, "max_iterations": 6,
            "scheduler": scheduler, "deadline_s": 600, "resources": {"atoms": 2}, "iteration_timeout_s": 120}
    path = tmp_path / "exp.json"
    path.write_text(json.dumps(spec))
    return path


CRASH = TERMINAL + """from thrifty.runtime.tuning import record
write, seen = record.RecordingExecutor._write, []
def crashing(self, event):
    write(self, event)
    seen.extend([1] if event["event"] == "result" else [])
    if len(seen) == {n}:
        raise RuntimeError("the driver crashed")
record.RecordingExecutor._write = crashing
""" + CLI


def start_driver(args: list[str], crash_after: int | None = None) -> subprocess.Popen:
    code = ["-c", TERMINAL_CLI] if crash_after is None else ["-c", CRASH.replace("{n}", str(crash_after))]
    return subprocess.Popen([sys.executable, *code, "tune", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def wait_for_results(log: Path, n: int, driver: subprocess.Popen, timeout_s: float = 240) -> None:
    """Until `log` holds `n` results (or the driver has exited)."""
    limit = time.monotonic() + timeout_s
    while time.monotonic() < limit and driver.poll() is None:
        if log.exists() and len(results_of(read_events(log))) >= n:
            return
        time.sleep(0.05)
    assert driver.poll() is not None or time.monotonic() < limit, "timed out waiting for results"


WAYS = {  # way -> (scheduler, expected exit code of the first run)
    "sigint": ({"name": "hypersched", "min_iterations": 1, "eta": 2}, 130),
    "sigterm": ({"name": "asha", "min_iterations": 1, "eta": 2}, 143),
    "sigkill": ({"name": "hypersched", "min_iterations": 1, "eta": 2}, -signal.SIGKILL),
    "crash": ({"name": "asha", "min_iterations": 1, "eta": 2}, 1),
}  # and the end itself: each of these runs ends, resumed, and a resume of the ended run is the fifth way


@pytest.mark.parametrize("way", sorted(WAYS))
def test_a_real_run_resumes_after_it_ends_in_each_way(tmp_path, way):
    scheduler, code = WAYS[way]
    path, out, plot = experiment_file(tmp_path, scheduler), tmp_path / "out", tmp_path / "elsewhere" / "p.png"
    log = out / "events.jsonl"
    driver = start_driver([str(path), "--out", str(out), "--plot", str(plot), "--no-progress"],
                          crash_after=4 if way == "crash" else None)
    try:
        # Ctrl-C and SIGTERM at the first result: the run is then surely mid-way (at the 4th, the trials' next
        # results came faster than the signal, and the run had reached its end, all paused, by the time it
        # stopped: a resume with nothing left to do)
        wait_for_results(log, {"sigint": 1, "sigterm": 1, "crash": 10**6}.get(way, 4), driver)
        if way in ("sigint", "sigterm"):
            os.kill(driver.pid, signal.SIGINT if way == "sigint" else signal.SIGTERM)
        elif way == "sigkill":
            os.killpg(driver.pid, signal.SIGKILL)  # the driver and every worker it forked
        _, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == code, err[-2000:]
    unheard = unheard_results_of(log, make_one=way == "sigkill") if way in ("sigkill", "crash") else set()
    before = read_events(log)
    assert before
    if way in ("sigint", "sigterm"):
        assert f"resume with: thrifty tune --resume {out} --no-progress" in err     # the exact command
        assert "stopping; the running trials finish their iteration" in err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["finished"] is False and summary["end_reason"] == {"sigint": "interrupted",
                                                                           "sigterm": "terminated"}[way]
    if way == "crash":  # the driver's failure saved what it had
        summary = json.loads((out / "summary.json").read_text())
        assert summary["finished"] is False and summary["end_reason"] == "crashed"
        assert "the driver crashed" in summary["error"] and summary["results"] >= 3  # the 4th raised in the log
    if way in ("sigkill", "crash"):  # every recorded result has its checkpoint (each iteration is durable)
        assert all(e.get("checkpoint") for e in before if e["event"] == "result")

    resumed = subprocess.run([sys.executable, "-m", "thrifty.runtime.cli", "tune", "--resume", str(out), "--json"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode in (0, 4), resumed.stderr[-2000:]
    after = read_events(log)[len(before):]
    assert after
    check_real_resume(before, after)
    # results checkpointed but not recorded are read back from the trials' checkpoints, not trained again
    assert {(e["trial"], e["iteration"]) for e in after if e.get("recovered")} == unheard
    for tid, iteration in unheard:
        assert f"trial {tid}: iteration {iteration}'s result was checkpointed" in resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["finished"] is True and summary["elapsed_s"] >= max(e["t"] for e in before)  # the clock carries
    assert plot.is_file()  # the plot the run was started with, without --plot again
    if way == "sigterm":  # the fifth way, the end: a resume of the run that ended says so and changes nothing
        ended = log.read_bytes()
        again = subprocess.run([sys.executable, "-m", "thrifty.runtime.cli", "tune", "--resume", str(out)],
                               capture_output=True, text=True, timeout=300)
        assert again.returncode in (0, 4) and "finished" in again.stderr, again.stderr[-2000:]
        assert log.read_bytes() == ended


def unheard_results_of(log: Path, make_one: bool = True) -> set[tuple[int, int]]:
    """The (trial, iteration) results that a resume of the killed or crashed run in `log` must read back from
    the trials' checkpoints: those the ranks checkpointed before the end but the driver never recorded (the
    checkpoint one iteration ahead of the trial's last result), and, if there is none and `make_one`, one
    made so: a running trial whose checkpoint holds its last recorded result has that result's line left
    out of the log, as if the kill had come between the checkpoint and the record."""
    from thrifty.runtime.ddp.checkpoint import load_checkpoint

    events = read_events(log)
    last = {}
    for i, e in enumerate(events):
        last[e["trial"]] = i
    unheard, recorded = set(), []
    for tid, i in last.items():
        e = events[i]
        path = log.parent / "trials" / f"trial-{tid}" / "checkpoint.pt"
        running = e["event"] in ("result", "launch") or (e["event"] == "terminate" and e.get("interrupted"))
        if not running or not path.is_file():
            continue
        reached = max([r["iteration"] for r in events if r["trial"] == tid and r["event"] == "result"]
                      + [r["from_iteration"] for r in events if r["trial"] == tid and r["event"] == "launch"])
        saved = int(load_checkpoint(str(path))["iteration"])
        if saved == reached + 1:
            unheard.add((tid, saved))
        elif e["event"] == "result" and saved == reached > 1:
            recorded.append(i)
    if not unheard and recorded and make_one:
        gone = events.pop(max(recorded))
        log.write_text("".join(json.dumps(e) + "\n" for e in events))
        unheard.add((gone["trial"], gone["iteration"]))
    return unheard


def check_real_resume(before, after) -> None:
    """Nothing finished is done again, whichever way the run ended: no ended trial launched, no recorded
    iteration trained again (the trials checkpoint every iteration before its result is recorded), every
    running trial launched again from the last iteration it recorded; the clock carries on."""
    kept = read_history(before, 6)
    ended = {t.trial_id for t in kept.trials if t.state in ENDED}
    assert not any(e["trial"] in ended for e in after if e["event"] == "launch")
    assert not kept.dropped
    assert not set(results_of(after)) & set(results_of(before))
    reached = {}
    for trial, iteration in results_of(before):
        reached[trial] = max(reached.get(trial, 0), iteration)
    recovered = {e["trial"] for e in after if e["event"] == "result" and e.get("recovered")}
    for tid in kept.running:
        first = next((e for e in after if e["event"] == "launch" and e["trial"] == tid), None)
        if first is not None:  # from its last recorded iteration (or the one recovered from its checkpoint)
            assert first["from_iteration"] == reached.get(tid, 0) + (tid in recovered)
    assert min(e["t"] for e in after) >= max(e["t"] for e in before) - 1e-6
    final = read_history(before + after, 6)
    assert len(final.trials) == 4 and not final.running
    assert all(t.state in ENDED or t.state == TrialState.PAUSED for t in final.trials)


def test_a_result_checkpointed_but_not_recorded_is_recovered_from_the_checkpoint(tmp_path):
    # the ranks checkpoint an iteration, with its result, before posting the result: a driver killed in between
    # leaves the trial's checkpoint one iteration ahead of its log; the resume reads the result back from it
    from thrifty.runtime.ddp.checkpoint import save_checkpoint
    from thrifty.runtime.tuning.executors.worlds import checkpointed_result, trial_checkpoint
    from thrifty.runtime.tuning.record import unheard_results

    workdir = tmp_path / "trials"

    def find(tid, after):
        return checkpointed_result(workdir, tid, after)

    def line(event, trial, t, **fields):
        return {"t": t, "event": event, "trial": trial, **fields}

    def result(trial, iteration, t):
        return line("result", trial, t, iteration=iteration, metric=-0.5, iteration_s=0.1, atoms=2, overhead_s=0.0,
                    at=t, checkpoint={"path": str(trial_checkpoint(workdir, trial)), "iteration": iteration})

    events = [line("launch", 0, 0.0, atoms=2, from_iteration=0, config={"lr": 0.1}), result(0, 1, 1.0),
              result(0, 2, 2.0), line("launch", 1, 2.5, atoms=1, from_iteration=0, config={"lr": 0.2}),
              result(1, 1, 3.0), line("terminate", 1, 3.5, iteration=1)]
    for trial, iteration in ((0, 3), (1, 2)):
        path = Path(trial_checkpoint(workdir, trial))
        path.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(str(path), {"iteration": iteration, "result": {"metric": 0.25, "iteration_s": 0.2}})
    lines = unheard_results(events, find, value=lambda score: -score)   # trial 1 ended: nothing to recover
    assert [(e["trial"], e["iteration"], e["metric"], e["recovered"], e["t"]) for e in lines] == [(0, 3, -0.25, True,
                                                                                                  3.5)]
    history = read_history(events + lines, 6, score=lambda value: -value)
    trial = history.trials[0]
    assert trial.metrics == [0.5, 0.5, 0.25] and trial.checkpoint["iteration"] == 3 and history.running == {0: 2}
    # a checkpoint at the recorded iteration (the result was recorded), or without a result: nothing
    save_checkpoint(str(trial_checkpoint(workdir, 0)), {"iteration": 2, "result": {"metric": 0.3, "iteration_s": 1}})
    assert unheard_results(events, find) == []
    save_checkpoint(str(trial_checkpoint(workdir, 0)), {"iteration": 3})
    assert unheard_results(events, find) == []


PLAN_WAYS = {"sigint": 130, "sigkill": -signal.SIGKILL}


@pytest.mark.parametrize("way", sorted(PLAN_WAYS))
def test_a_real_plan_run_resumes_after_ctrl_c_or_sigkill(tmp_path, way):
    # RubberBand's stages (4, 2, 1 trials) on the local provider, stopped after 3 results, then resumed: the
    # recorded plan goes on (plan.json), nothing recorded is trained again, and the clock carries on
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"format": "thrifty.scaling_profile/1", "model": "example",
                                   "instance_type": "local-a", "startup_s": 1.0,
                                   "points": [{"gpus": 1, "iteration_s": 0.3}, {"gpus": 2, "iteration_s": 0.2}]}))
    path = experiment_file(tmp_path, {"name": "plan", "min_iterations": 1, "eta": 2})
    spec = json.loads(path.read_text())
    spec.update(max_iterations=4, deadline_s=120, resources={
        "instance_type": "local-a", "catalog": str(ROOT / "datasets" / "examples" / "local-demo-catalog.json"),
        "max_instances": 2, "model": str(profile)})
    path.write_text(json.dumps(spec))
    out = tmp_path / "out"
    log = out / "events.jsonl"
    driver = start_driver([str(path), "--out", str(out), "--no-progress"])
    try:
        wait_for_results(log, 3, driver)
        if way == "sigint":
            os.kill(driver.pid, signal.SIGINT)
        else:
            os.killpg(driver.pid, signal.SIGKILL)
        _, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == PLAN_WAYS[way], err[-2000:]
    if way == "sigint":
        assert f"resume with: thrifty tune --resume {out} --no-progress" in err
        assert json.loads((out / "summary.json").read_text())["finished"] is False
    before = read_events(log)
    assert (out / "plan.json").is_file() and len(results_of(before)) >= 3
    assert all(e.get("checkpoint") for e in before if e["event"] == "result")
    resumed = subprocess.run([sys.executable, "-m", "thrifty.runtime.cli", "tune", "--resume", str(out), "--json"],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode in (0, 4), resumed.stderr[-2000:]
    after = read_events(log)[len(before):]
    assert not set(results_of(after)) & set(results_of(before))            # nothing recorded trained again
    assert min(e["t"] for e in after) >= max(e["t"] for e in before) - 1e-6   # the clock carries on
    summary = json.loads(resumed.stdout)
    assert summary["finished"] is True and summary["end_reason"].startswith("plan")
    assert summary["elapsed_s"] >= max(e["t"] for e in before) and summary["cost_usd"] > 0
    # the recorded plan's stages carried out: each stage's trials trained to the stage's end, one survivor
    stages = json.loads((out / "plan.json").read_text())["stages"]
    assert [s["trials"] for s in stages] == [4, 2, 1]
    ends = [sum(s["iters_per_trial"] for s in stages[:k + 1]) for k in range(3)]
    final = {t["trial"]: t for t in summary["per_trial"]}
    assert sorted(t["iterations"] for t in final.values()) == [ends[0], ends[0], ends[1], ends[2]]
    assert [t["state"] for t in final.values()].count("completed") == 1
    reached = {}
    for trial, iteration in results_of(before + after):
        assert iteration == reached.get(trial, 0) + 1   # each iteration once, in order
        reached[trial] = iteration


# --- the command line -------------------------------------------------------------------------

def test_resume_restores_the_cluster_the_run_was_started_with(tmp_path, capsys):
    # a run's folder keeps its cluster: --resume DIR alone (here a dry run) describes the run on that cluster,
    # not a fresh local run; --cluster given again overrides it
    path = experiment_file(tmp_path, {"name": "fifo"})
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "experiment.json").write_text(path.read_text())
    (folder / "options.json").write_text(json.dumps({"cluster": "ray://127.0.0.1:9", "plot": str(tmp_path / "p.png")}))
    # the dry run checks the run as it would start: on the stored cluster, which needs a machine type
    assert main(["tune", "--resume", str(folder), "--dry-run"]) == 2
    shown = capsys.readouterr()
    assert "is required on a cluster" in shown.err and "worker processes on this host" not in shown.out
    assert main(["tune", "--resume", str(folder), "--dry-run", "--cluster", "local"]) == 0
    assert "worker processes on this host" in capsys.readouterr().out


def test_resume_without_a_folder_takes_the_out_folder_or_the_newest_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = experiment_file(tmp_path, {"name": "fifo"})
    for name in ("old", "new"):
        folder = tmp_path / "thrifty-runs" / name
        folder.mkdir(parents=True)
        (folder / "experiment.json").write_text(path.read_text())
        (folder / "summary.json").write_text(json.dumps({"end_reason": "exhausted", "finished": True}))
        time.sleep(0.02)
    assert main(["tune", "--resume"]) == 0
    err = capsys.readouterr().err
    assert "resuming thrifty-runs/new" in err and "finished" in err
    assert main(["tune", "--resume", "--out", "thrifty-runs/old"]) == 0
    assert "thrifty-runs/old finished" in capsys.readouterr().err
    (tmp_path / "thrifty-runs").rename(tmp_path / "elsewhere")
    assert main(["tune", "--resume"]) == 2
    assert "no tuning run under thrifty-runs" in capsys.readouterr().err


def test_the_help_lists_every_exit_code_and_the_conventions(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    # the codes themselves: test_cli.py's test of every command's help; here what tune says of them
    for code in ("0 success: the target reached", "1 a failure", "2 bad input", "3 infeasible: no stage plan",
                 "4 finished outside its limits or goal: ended without reaching the target", "130 interrupted",
                 "143 terminated (SIGTERM): handled as Ctrl-C", "After 130 or 143 the state is saved"):
        assert code in text
    assert "--no-progress" in text and "thrifty-runs/NAME-TIME" in text and "--resume [DIR]" in text


def test_the_live_table_never_cuts_a_header(tmp_path):
    # the README's experiment at 120 columns (and narrower): every column shown has its whole name, and
    # the ones that do not fit are named in the caption
    from rich.console import Console

    from thrifty.runtime.commands.tune import LiveTable
    from thrifty.runtime.tuning.experiment_file import load_experiment

    e = load_experiment(ROOT / "datasets" / "examples" / "tune-digits.json")

    class Executor:
        trials = {i: Trial(i, {"learning_rate": 0.0123456 * (i + 1), "optimizer": "momentum", "width": 128,
                               "depth": 2, "weight_decay": 1.2345e-05, "batch_size": 64},
                           state=TrialState.RUNNING, atoms=1, metrics=[0.5, 0.61]) for i in range(3)}

    for width in (120, 100, 80):
        console = Console(width=width, record=True, file=open(os.devnull, "w"))
        table = LiveTable(e, console)
        table.executor = Executor()
        console.print(table.render(1.0))
        text = console.export_text()
        assert "…" not in text, text
        for name in ("learning_rate", "optimizer", "width", "depth", "weight_decay", "batch_size"):
            assert name in text, (width, text)
        assert max(len(line) for line in text.splitlines()) <= width


def test_a_signal_the_run_started_ignoring_stays_ignored():
    """A run started with a signal ignored (a background job's Ctrl-C) keeps ignoring it, `thrifty tune` as
    `thrifty run` does (Python leaves an inherited SIG_IGN); a signal it was started with a handler for stops it."""
    from thrifty.runtime.commands.run import _sigterm_interrupts
    from thrifty.runtime.tuning.driver import _Signals

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with _Signals() as signals:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == signals._handle
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with _sigterm_interrupts():
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with _sigterm_interrupts():
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_tune_runs_go_where_run_runs_go_and_git_ignores_them(tmp_path):
    """One folder for both commands' runs (``thrifty-runs/``, not a ``thrifty-tune/`` of its own), git-ignored."""
    from thrifty.runtime.runs import RUNS_FOLDER
    from thrifty.runtime.training.rundir import default_run_dir
    from thrifty.runtime.tuning.driver import _results_folder
    from thrifty.runtime.tuning.experiment_file import parse_experiment

    e = parse_experiment({"name": "small", "trainer": "thrifty.runtime.tuning.executors.worlds:example_trainer",
                          "search_space": {"lr": {"loguniform": [0.003, 0.5]}}, "samples": 2, "max_iterations": 2,
                          "scheduler": {"name": "asha"}, "deadline_s": 60, "resources": {"atoms": 1}})
    folder = _results_folder(e, None, None)
    assert folder.parent == Path(RUNS_FOLDER) and default_run_dir("x").parent.name == RUNS_FOLDER == "thrifty-runs"
    assert folder.name.startswith("small-")
    assert "thrifty-runs/" in (Path(__file__).resolve().parents[1] / ".gitignore").read_text().split()
