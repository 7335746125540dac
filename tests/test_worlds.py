"""The worker-world package (issue 15): one way to start N ranks with a
rendezvous, one event protocol, timeouts, ranks that die with their starter,
every process reaped. Real forked processes and real gloo process groups on
127.0.0.1."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("torch", reason="worker worlds need torch; pip install -e '.[all]'")

from thrifty.runtime.worlds import World, WorldFailed  # noqa: E402
from thrifty.runtime.worlds.rank import records_key  # noqa: E402


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_world_forms_talks_and_returns_every_ranks_result(tmp_path):
    world = World(3, "world_entries:sum_ranks", ["a", "b"], logs=lambda r: tmp_path / f"r{r}.log",
                  where="the test world", timeout_s=60)
    seen: list[int] = []
    results = world.run(stall_timeout_s=60, on_progress=seen.append)
    assert results == [{"rank": r, "total": 6, "argv": ["a", "b"]} for r in range(3)]
    assert seen[-1] == 9  # three ranks, three steps each
    assert all((tmp_path / f"r{r}.log").exists() for r in range(3))
    assert not any(_alive(pid) for pid in world.pids)


def test_events_arrive_in_one_protocol(tmp_path):
    world = World(2, "world_entries:sum_ranks", logs=lambda r: tmp_path / f"r{r}.log").start()
    try:
        events: list[dict] = []
        limit = time.monotonic() + 60
        received: list[dict] = []
        while sum(e["event"] == "finished" for e in events) < 2 and time.monotonic() < limit:
            events += world.events()
            received += world.receive("steps")
            time.sleep(0.05)
        received += world.receive("steps")
        assert received == [{"step": 0}, {"step": 1}, {"step": 2}] and world.receive("steps") == []  # each once
        assert not any(world.store.check([records_key("steps", n)]) for n in (1, 2, 3))  # read ones are deleted
        hello = [e for e in events if e["event"] == "hello"]
        assert sorted(e["rank"] for e in hello) == [0, 1]
        assert all(e["env_thrifty"] == "1" and e["at"] > 0 for e in hello)
        assert world.progress(1)[0] == 3
    finally:
        world.close(grace_s=10)
    assert world.exit_codes() == [0, 0]


def test_a_rank_that_raises_fails_the_world_with_its_traceback(tmp_path):
    world = World(3, "world_entries:fail", ["2"], logs=lambda r: tmp_path / f"r{r}.log", where="the failing world")
    with pytest.raises(WorldFailed, match="the failing world: rank 2 failed") as info:
        world.run(stall_timeout_s=60)
    assert "ValueError: rank failed on purpose" in str(info.value)
    assert not any(_alive(pid) for pid in world.pids)  # the others were killed and reaped
    assert "rank failed on purpose" in (tmp_path / "r2.log").read_text()


def test_a_rank_that_dies_fails_the_world_and_names_its_log(tmp_path):
    world = World(2, "world_entries:die", logs=lambda r: tmp_path / f"r{r}.log", where="w")
    with pytest.raises(WorldFailed, match=r"w: a worker died \(rank 1 exit code 3; log: .*r1.log\)"):
        world.run(stall_timeout_s=60)
    assert not any(_alive(pid) for pid in world.pids)


def test_a_stalled_world_is_stopped(tmp_path):
    world = World(2, "world_entries:hang", logs=lambda r: tmp_path / f"r{r}.log", where="the hung world")
    started = time.monotonic()
    with pytest.raises(WorldFailed, match="the hung world: no progress for 1.5 s") as stalled:
        world.run(stall_timeout_s=1.5)
    assert time.monotonic() - started < 30
    # the failure says where each rank was: its stack, dumped to its log on the starter's signal
    message = str(stalled.value)
    assert "rank 0 (" in message and "rank 1 (" in message
    assert "in <lambda>" in message and "world_entries.py" in message
    assert not any(_alive(pid) for pid in world.pids)


def test_a_world_that_owes_a_result_says_so(tmp_path):
    world = World(2, "world_entries:no_result", logs=lambda r: tmp_path / f"r{r}.log", where="w")
    with pytest.raises(WorldFailed, match=r"w: the workers exited without a result \(ranks 0, 1\)"):
        world.run(stall_timeout_s=60)


def test_the_caller_chooses_the_error_type(tmp_path):
    world = World(1, "world_entries:fail", ["0"], logs=lambda r: tmp_path / f"r{r}.log")
    with pytest.raises(KeyError):
        world.run(stall_timeout_s=60, failure=KeyError)


def test_commands_reach_the_ranks(tmp_path):
    world = World(2, "world_entries:wait_for_go", logs=lambda r: tmp_path / f"r{r}.log").start()
    world.command("go", "now")
    assert world.run(stall_timeout_s=60) == ["now", "now"]


def test_closing_kills_and_reaps_every_rank(tmp_path):
    world = World(2, "world_entries:hang", logs=lambda r: tmp_path / f"r{r}.log").start()
    limit = time.monotonic() + 30
    while len(world.pids) < 2 and time.monotonic() < limit:
        time.sleep(0.05)
    pids = world.pids
    assert all(_alive(pid) for pid in pids)
    world.close()
    assert all(code is not None and code < 0 for code in world.exit_codes())
    assert not any(_alive(pid) for pid in pids)
    assert os.getpid() not in pids


def test_the_colocated_gradient_exchange_averages_every_bucket(tmp_path):
    # the co-located profiler exchanges gradients as DDP does: buckets of DDP's sizes, one dtype each
    world = World(2, "world_entries:exchange_gradients", logs=lambda r: tmp_path / f"r{r}.log", timeout_s=60)
    results = world.run(stall_timeout_s=60)
    for result in results:
        assert len(result["errors"]) == 5 and max(result["errors"]) < 1e-5
        assert result["none_left"]


def test_a_rank_whose_machines_fork_server_died_is_reported_lost_not_running(tmp_path):
    """A Ray machine agent's side (`NodeRanks`, here a plain object): once the fork server is gone, its
    ranks (which die with it) report the lost code, instead of running forever to a world that waits."""
    pytest.importorskip("ray", reason="the Ray launcher's node side needs Ray")
    import signal
    import sys

    from thrifty.runtime.worlds.ray import LOST_CODE, NodeRanks
    from thrifty.runtime.worlds.zygote import zygote

    ranks = NodeRanks()
    pid = ranks.launch("world_entries:sleep_alone", ["600"], {}, str(tmp_path / "rank.log"), list(sys.path))
    assert ranks.exit_codes([pid]) == {pid: None}
    os.kill(zygote().proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while ranks.exit_codes([pid])[pid] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ranks.exit_codes([pid]) == {pid: LOST_CODE}
