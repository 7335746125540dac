"""The training runtime with real worker processes: gloo process groups on
127.0.0.1, real checkpoints, injected preemptions. Tiny float64 MLP (8 -> 16 ->
4), worlds of 1-3 ranks. Each test checks that no worker outlives it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from dataclasses import replace  # noqa: E402

from thrifty.core.errors import ProblemError  # noqa: E402
from thrifty.runtime.providers.local import LocalProvider  # noqa: E402
from thrifty.runtime.training import (  # noqa: E402
                                      DelayStart,
                                      Hooks,
                                      KillWorker,
                                      RunConfig,
                                      SlowWorker,
                                      StallError,
                                      WorkerFailed,
                                      WorldFormationError,
                                      read_run_log,
                                      train,
                                      )
from thrifty.runtime.ddp.steps import single_process_reference  # noqa: E402

from test_training_runtime_units import DEMO_CATALOG, demo_problem, plan_dict  # noqa: E402

TINY = "thrifty.runtime.training.examples:tiny_mlp"
B = 16
HETEROGENEOUS = (("local-a", "spot", 1, 3), ("local-b", "spot", 1, 5), ("local-b", "on_demand", 1, 8))
FAST = RunConfig(checkpoint_every=10, checkpoint_every_s=None, poll_s=0.02, world_timeout_s=90,
                 stall_timeout_s=90, stop_timeout_s=60, collective_timeout_s=90, window_s=5, window_bins=5)


def process_parents() -> dict[int, int]:
    """pid -> parent pid of every live (not zombie) process."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    return parents


def worker_pids() -> list[int]:
    """Live processes below this test process, except the session's helpers: the
    worker fork server (the zygote) and multiprocessing's resource tracker
    (started by the first spawn-context semaphore, e.g. the profiler's)."""
    helpers = {pid for pid, parent in process_parents().items() if parent == os.getpid()
               and any(name in _cmdline(pid) for name in (b"thrifty.runtime.worlds.zygote",
                                                          b"multiprocessing.resource_tracker"))}
    return sorted(descendants(os.getpid()) - helpers)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture(autouse=True)
def no_leftover_workers():
    yield
    assert worker_pids() == []


def model_state(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def plain_ddp_reference(batches: list[int], iterations: int) -> dict:
    """What DDP's plain averaging would train: each rank's mean gradient
    weighted 1/W, i.e. sample j of rank r weighted 1/(W * b_r)."""
    from thrifty.runtime.ddp.checkpoint import seed_everything
    from thrifty.runtime.training.examples import tiny_mlp
    from thrifty.runtime.ddp.sharding import ShardedStream
    from thrifty.runtime.ddp.steps import fetch_batch

    made = tiny_mlp()
    seed_everything(0)
    model = made.model()
    optimizer = made.optimizer(model.parameters())
    dataset = made.dataset()
    stream = ShardedStream(len(dataset), B, 0, B, seed=0)
    weights = torch.cat([torch.full((b,), 1.0 / (len(batches) * b), dtype=torch.float64) for b in batches])
    for it in range(iterations):
        x, y = fetch_batch(dataset, stream.indices(it), "cpu")
        optimizer.zero_grad()
        (torch.nn.functional.cross_entropy(model(x), y, reduction="none") * weights).sum().backward()
        optimizer.step()
    return model.state_dict()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Heterogeneous local batches [3, 5, 8], 12 iterations, no faults."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    result = train(plan_dict(*HETEROGENEOUS), TINY, problem=demo_problem(iterations=12), run_dir=folder,
                   config=FAST)
    return result


def test_heterogeneous_batches_train_as_one_device_on_the_global_batch(uninterrupted):
    assert uninterrupted.iterations == 12 and uninterrupted.segments[0].batches == (3, 5, 8)
    final = model_state(uninterrupted.checkpoint_path)
    reference = single_process_reference(TINY, B, 12)
    assert max_difference(final, reference) < 1e-6
    # without reweighting (plain DDP averaging) the parameters would be far off
    assert max_difference(plain_ddp_reference([3, 5, 8], 12), reference) > 1e-3


def test_every_loss_and_metric_reported_goes_to_the_run_folder_s_metrics_jsonl(uninterrupted):
    reported = [e for e in read_run_log(uninterrupted.log_path) if e["event"] == "metrics"]
    written = [json.loads(line) for line in (uninterrupted.run_dir / "metrics.jsonl").read_text().splitlines()]
    # the Trainer short form computes its loss and metrics only where they are recorded (about every
    # metrics_every_s, a world's first iteration and its last): each record is written once, in order; the run
    # log has the last of each poll
    assert_metrics_once_in_order(uninterrupted.run_dir, 12)
    assert reported[-1]["iteration"] == 12
    assert {(e["iteration"], json.dumps({"loss": e["loss"], **e["metrics"]})) for e in reported} <= \
        {(w["step"], json.dumps(w["metrics"])) for w in written if w["tags"] == {}}
    assert all(w["metrics"]["loss"] > 0 and 0 <= w["metrics"]["accuracy"] <= 1 for w in written)


def assert_metrics_once_in_order(run_dir, iterations: int) -> None:
    """The run's metrics.jsonl holds each record once, in iteration order
    (across re-plans too), from a world's first iteration to the job's last."""
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[0] == 1 and steps[-1] == iterations and steps == sorted(set(steps)), steps


def test_the_reweighting_comm_hook_trains_the_same(tmp_path):
    config = RunConfig(**{**FAST.__dict__, "weighting": "hook"})
    result = train(plan_dict(*HETEROGENEOUS), TINY, problem=demo_problem(iterations=12), run_dir=tmp_path,
                   config=config)
    assert max_difference(model_state(result.checkpoint_path), single_process_reference(TINY, B, 12)) < 1e-6


def test_interrupted_and_resumed_equals_uninterrupted_parameter_for_parameter(uninterrupted, tmp_path):
    first = train(plan_dict(*HETEROGENEOUS), TINY, problem=demo_problem(iterations=5), run_dir=tmp_path,
                  config=FAST)
    assert first.iterations == 5
    resumed = train(plan_dict(*HETEROGENEOUS), TINY, problem=demo_problem(iterations=12), run_dir=tmp_path,
                    config=FAST, resume=True)
    assert resumed.segments[0].start_iteration == 5 and resumed.iterations == 12
    final, reference = model_state(resumed.checkpoint_path), model_state(uninterrupted.checkpoint_path)
    for name in reference:
        assert torch.equal(final[name], reference[name]), name
    started = [e for e in read_run_log(tmp_path / "run.jsonl") if e["event"] == "world_formed"]
    assert [e["rng"] for e in started] == ["seeded", "restored"]


DRIVER = """
import sys
sys.path.insert(0, {tests!r})
from thrifty.runtime.training import RunConfig, SlowWorker, train
from test_training_runtime_units import demo_problem, plan_dict
train(plan_dict(("local-a", "spot", 1, 8), ("local-b", "spot", 1, 8)), {trainer!r},
      problem=demo_problem(iterations=200), run_dir={run_dir!r}, faults=[SlowWorker(0, from_iteration=0, extra_s=0.02)],
      config=RunConfig(checkpoint_every=10, checkpoint_every_s=None, replan_on_slowdown=False))
"""


def descendants(pid: int) -> set[int]:
    parents = process_parents()
    below, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - below
        below |= frontier
    return below


def live_pids() -> set[int]:
    return set(process_parents())


def test_a_killed_driver_takes_its_workers_along_and_the_run_resumes(tmp_path):
    import signal
    import time

    code = DRIVER.format(tests=str(Path(__file__).parent), trainer=TINY, run_dir=str(tmp_path))
    driver = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 90
        while not any(e["event"] == "checkpoint" and e["iteration"] >= 30 for e in _events(tmp_path)):
            assert driver.poll() is None and time.monotonic() < deadline, "the driver never reached iteration 30"
            time.sleep(0.1)
        workers = descendants(driver.pid)
        assert len(workers) >= 3  # the zygote and two workers
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        deadline = time.monotonic() + 20
        while workers & live_pids():
            assert time.monotonic() < deadline, f"processes outlived their driver: {workers & live_pids()}"
            time.sleep(0.1)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["iteration"]
    assert 30 <= saved < 200
    resumed = train(plan_dict(("local-a", "spot", 1, 8), ("local-b", "spot", 1, 8)), TINY,
                    problem=demo_problem(iterations=200), run_dir=tmp_path, config=FAST, resume=True)
    assert resumed.segments[0].start_iteration == saved and resumed.iterations == 200
    assert max_difference(model_state(resumed.checkpoint_path), single_process_reference(TINY, B, 200)) < 1e-6
    assert_metrics_once_in_order(tmp_path, 200)  # the resumed session writes no iteration the killed one wrote


def _events(folder: Path) -> list[dict]:
    try:
        return read_run_log(folder / "run.jsonl")
    except (FileNotFoundError, ProblemError):  # not there yet, or a line half written
        return []


def check_accounting(result, total: int, every: int) -> None:
    """Each iteration is committed exactly once: every world starts at the
    checkpoint the previous one left, and work is lost only after the last
    checkpoint."""
    segments = result.segments
    assert segments[0].start_iteration == 0 and segments[-1].committed_iteration == total
    assert segments[-1].ended == "finished"
    for before, after in zip(segments, segments[1:]):
        assert after.start_iteration == before.committed_iteration
        assert 0 <= before.lost_iterations < every
    assert sum(s.committed_iteration - s.start_iteration for s in segments) == total


def test_preemption_without_notice_replans_and_finishes_like_an_uninterrupted_run(tmp_path):
    hooks, seen = Hooks(), []
    for name in ("preemption", "replanned", "finished", "slowdown"):
        hooks.on(name, lambda payload, name=name: seen.append((name, payload)))
    result = train(plan_dict(*HETEROGENEOUS), TINY, problem=demo_problem(iterations=60), run_dir=tmp_path,
                   config=FAST, hooks=hooks, faults=[KillWorker(0, at_iteration=25)])
    assert result.iterations == 60
    [event] = result.preemptions
    assert (event.source, event.instance_type, event.market, event.time_left_s) == ("worker-exit", "local-a", "spot", 0)
    lost, after = result.segments
    assert (lost.ended, lost.reached_iteration, lost.committed_iteration) == ("lost", 25, 20)
    check_accounting(result, 60, every=10)
    [replan] = result.replans
    assert replan.problem.iterations == 40  # restarted from the checkpoint at 20
    assert all((a.instance_type, a.market) != ("local-a", "spot") for a in replan.new_plan.allocation)
    assert [name for name, _ in seen] == ["preemption", "replanned", "finished"]
    assert_metrics_once_in_order(result.run_dir, 60)  # the new world's replays of 21..25 are not written again
    assert max_difference(model_state(result.checkpoint_path), single_process_reference(TINY, B, 60)) < 1e-6
    events = [e["event"] for e in read_run_log(result.log_path)]
    for name in ("start", "launch", "world_formed", "checkpoint", "preemption", "replan", "segment_end", "finish"):
        assert name in events


def assert_stopped_on_notice_without_loss(result, provider, noticed_from: int, iterations: int = 50) -> None:
    """The run stopped its first world on a notice at or after iteration
    `noticed_from` without losing an iteration, then finished exactly as one
    process would, and gave every machine back."""
    noticed, _last = result.segments
    assert noticed.ended == "stopped" and noticed.lost_iterations == 0
    assert noticed.committed_iteration >= noticed_from
    check_accounting(result, iterations, every=10)
    assert_metrics_once_in_order(result.run_dir, iterations)
    assert max_difference(model_state(result.checkpoint_path), single_process_reference(TINY, B, iterations)) < 1e-6
    assert provider.machines() == []


def test_capacity_error_and_spot_notice_replan_without_losing_work(tmp_path):
    provider = LocalProvider("capacity", DEMO_CATALOG, capacity={("local-b", "spot"): 0})
    plan = plan_dict(("local-a", "spot", 1, 8), ("local-b", "spot", 1, 8))
    # from the notice on, each iteration is 50 ms slower, so the last 30 cannot finish before the driver stops
    # the world on a loaded host (a slowdown re-plan is off: this test is about the notice)
    slow = SlowWorker(0, 20, 0.05)
    with provider:
        result = train(plan, TINY, problem=demo_problem(iterations=50), run_dir=tmp_path,
                       config=replace(FAST, replan_on_slowdown=False), provider=provider,
                       faults=[KillWorker(0, at_iteration=20, warning_s=120.0), slow])
    assert [e.source for e in result.preemptions] == ["capacity", "injector"]
    assert result.preemptions[1].time_left_s == 120.0
    assert [r.reason for r in result.replans] == ["capacity", "preemption"]
    assert all((a.instance_type, a.market) != ("local-b", "spot")
               for r in result.replans for a in r.new_plan.allocation)
    assert_stopped_on_notice_without_loss(result, provider, noticed_from=20)


def test_a_spot_notice_from_the_provider_replans_without_losing_work(tmp_path):
    """A notice the provider gives (here `LocalProvider.interrupt`, as EC2's
    instance-action would come) reaches the driver through the interruption feed."""
    provider = LocalProvider("notice", DEMO_CATALOG)
    plan = plan_dict(("local-a", "spot", 1, 8), ("local-b", "spot", 1, 8))
    told = []

    def on_progress(snapshot):
        if not told and snapshot.state == "training" and snapshot.iterations >= 15:
            machine = next(m for m in provider.machines() if m.instance_type == "local-a")
            told.append(provider.interrupt(machine.id, time_left_s=120.0, reason="test: spot notice"))

    # from iteration 10 on, each iteration is 50 ms slower: a stop lands within the exchange's bound (at most
    # as many iterations as the world had made, about 16 here) of the notice reaching rank 0, and the driver
    # sees iteration 15 (and gives the notice) some iterations late on a loaded host; without it the last 35
    # tiny iterations took about as long as that, and the run ended before the stop (a slowdown re-plan is off:
    # this test is about the notice)
    with provider:
        result = train(plan, TINY, problem=demo_problem(iterations=50), run_dir=tmp_path,
                       config=replace(FAST, replan_on_slowdown=False), provider=provider, on_progress=on_progress,
                       faults=[SlowWorker(0, 10, 0.05)])
    assert list(result.preemptions) == told
    [replan] = result.replans
    assert replan.reason == "preemption" and replan.event == told[0]
    assert all((a.instance_type, a.market) != ("local-a", "spot") for a in replan.new_plan.allocation)
    assert_stopped_on_notice_without_loss(result, provider, noticed_from=15)


class Enough(Exception):
    pass


def test_a_persistent_slowdown_reaches_the_hooks_and_a_hook_can_stop_the_run(tmp_path):
    from thrifty.runtime.training import SlowWorker

    hooks, verdicts = Hooks(), []

    @hooks.on("slowdown")
    def stop(verdict):
        verdicts.append(verdict)
        raise Enough("behind schedule")

    config = RunConfig(**{**FAST.__dict__, "window_s": 1.0, "window_bins": 4, "checkpoint_every": 20})
    problem = demo_problem(iterations=400, limits={"time_s": 12.0})
    with pytest.raises(Enough):
        train(plan_dict(("local-b", "spot", 1, 16)), TINY, problem=problem, run_dir=tmp_path, config=config,
              hooks=hooks, faults=[SlowWorker(0, from_iteration=40, extra_s=0.05)])
    [verdict] = verdicts
    assert verdict.replan and verdict.violation == ("time",) and verdict.optimistic_total_s > 12.0
    assert verdict.iterations >= 40 + 4  # at least a window of slow iterations was seen
    events = read_run_log(tmp_path / "run.jsonl")
    assert [e["event"] for e in events][-2:] == ["slowdown", "error"]
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["iteration"] >= 40


def test_a_world_that_fails_to_form_is_a_clear_error_and_keeps_the_checkpoint(tmp_path):
    plan = plan_dict(("local-a", "spot", 1, 8), ("local-b", "spot", 1, 8))
    train(plan, TINY, problem=demo_problem(iterations=10), run_dir=tmp_path, config=FAST)
    saved = (tmp_path / "checkpoint.pt").read_bytes()
    config = RunConfig(**{**FAST.__dict__, "world_timeout_s": 3.0})
    with pytest.raises(WorldFormationError, match=r"did not form within 3 s \(ranks 1 never joined\)"):
        train(plan, TINY, problem=demo_problem(iterations=20), run_dir=tmp_path, config=config, resume=True,
              faults=[DelayStart(1, seconds=60)])
    assert (tmp_path / "checkpoint.pt").read_bytes() == saved
    assert read_run_log(tmp_path / "run.jsonl")[-1]["event"] == "error"


def failing_model_trainer():
    from thrifty.runtime.training.examples import tiny_mlp

    def model():
        raise ValueError("weights not found")

    return tiny_mlp().__class__(model=model, optimizer=tiny_mlp().optimizer, dataset=tiny_mlp().dataset,
                                loss=tiny_mlp().loss)


def test_a_trainer_that_raises_in_the_workers_is_a_clear_error(tmp_path):
    with pytest.raises(WorkerFailed, match=r"rank 0 failed: ProblemError: trainer .*model\(\) raised "
                                           r"ValueError: weights not found"):
        train(plan_dict(("local-a", "spot", 1, 16)), "test_training_runtime_processes:failing_model_trainer",
              problem=demo_problem(), run_dir=tmp_path, config=FAST)


def test_a_stalled_worker_is_stopped_not_waited_for(tmp_path):
    from thrifty.runtime.ddp.job import JobSpec, WorkerFault
    from thrifty.runtime.training.launcher import RankSlot, Segment

    job = JobSpec(trainer=TINY, global_batch=B, iterations=50, batches=(8, 8), checkpoint_path=str(tmp_path / "c.pt"),
                  checkpoint_every=5, faults=(WorkerFault(1, "hang", at_iteration=7),), timeout_s=60)
    slots = [RankSlot(r, f"m{r}", "local-a", "spot", "127.0.0.1", r, 0, 1, 8) for r in range(2)]
    with Segment(job, slots, tmp_path, world_timeout_s=90, stall_timeout_s=2.0) as segment:
        segment.start()
        with pytest.raises(StallError, match="no progress for 2 s"):
            while True:
                segment.poll()
    assert segment.last_checkpoint == 5


GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.parametrize("backend", [
    "gloo",
    pytest.param("nccl", marks=pytest.mark.skipif(GPUS == 0, reason="the NCCL path needs a CUDA GPU; "
                                                  "it runs wherever torch sees one")),
])
def test_the_worker_entry_runs_under_torchrun(tmp_path, backend):
    # torchrun is `python -m torch.distributed.run`: run with this interpreter, not the first `torchrun` on
    # PATH, which may be another Python's, where thrifty is not installed (a virtualenv with the system's
    # site packages has no torchrun of its own)
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    checkpoint = tmp_path / "checkpoint.pt"
    ranks = 2 if backend == "gloo" else min(2, GPUS)
    batches = "5,11" if ranks == 2 else "16"
    done = subprocess.run(
        [*torchrun, "--standalone", "--nproc-per-node", str(ranks), "-m", "thrifty.runtime.ddp.worker",
         "--trainer", TINY, "--batches", batches, "--iterations", "8", "--checkpoint", str(checkpoint),
         "--checkpoint-every", "4", "--timeout", "60", "--backend", backend],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert torch.load(checkpoint, weights_only=True)["iteration"] == 8
    assert max_difference(model_state(checkpoint), single_process_reference(TINY, B, 8)) < 1e-6


def test_run_command_solves_runs_and_reports(tmp_path, capsys):
    from thrifty.runtime.cli import main

    problem = tmp_path / "problem.json"
    problem.write_text(json.dumps(demo_problem(iterations=20, limits={"time_s": 3600})))
    code = main(["run", str(problem), "--trainer", TINY, "--run-dir", str(tmp_path / "run"), "--json",
                 "--checkpoint-every", "5", "--window", "5", "--plot", str(tmp_path / "run.png")])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["iterations"] == 20 and out["within_limits"] and len(out["segments"]) == 1
    assert (tmp_path / "run.png").stat().st_size > 1000
    events = read_run_log(tmp_path / "run" / "run.jsonl")
    assert [e["iteration"] for e in events if e["event"] == "checkpoint"] == [5, 10, 15, 20]
    segment = out["segments"][0]  # predicted against measured, per segment, in the result and the log
    assert segment["predicted_iteration_s"] == out_plan(events)["predicted"]["iteration_s"]
    assert segment["prediction_ratio"] == pytest.approx(1 / segment["throughput"] / segment["predicted_iteration_s"])
    assert [e["prediction_ratio"] for e in events if e["event"] == "segment_end"] == [segment["prediction_ratio"]]
    with pytest.raises(ProblemError, match="already holds a checkpoint"):
        train(out_plan(events), TINY, problem=str(problem), run_dir=tmp_path / "run")


def out_plan(events: list[dict]) -> dict:
    return next(e for e in events if e["event"] == "start")["plan"]


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="the leftover-process check reads /proc (Linux)")
