"""The one watcher of worker worlds (issue 34): what each look at a world
says, and in which order its outcomes come, on a world played by a stand-in
(no process, no torch): exit codes, events and progress set by the test."""

from __future__ import annotations

import time
from typing import Any

import pytest

from thrifty.runtime.worlds.watch import Failed, Finished, Killed, Lost, ServerGone, Stalled, Watch


class FakeProc:
    def __init__(self) -> None:
        self.exitcode: int | None = None
        self.machine_lost = False


class FakeWorld:
    """The part of `World` a watch reads, played by the test."""

    def __init__(self, size: int) -> None:
        self.procs = [FakeProc() for _ in range(size)]
        self.pending: list[dict[str, Any]] = []
        self.progress_of: dict[int, tuple[int, float]] = {}
        self.store_failed: str | None = None
        self.server_alive = True
        self.settled_since: float | None = None  # settled() is true for `since` up to this (None: always)
        self.hurried = 0

    def post(self, event: str, rank: int, **data: Any) -> None:
        self.pending.append({"event": event, "rank": rank, "at": time.time(), **data})

    def events(self) -> list[dict[str, Any]]:
        out, self.pending = self.pending, []
        return out

    def progress(self, rank: int) -> tuple[int, float] | None:
        return self.progress_of.get(rank)

    def exit_codes(self) -> list[int | None]:
        return [p.exitcode for p in self.procs]

    def machines_lost(self) -> list[int]:
        return [r for r, p in enumerate(self.procs) if p.machine_lost]

    def settled(self, since: float) -> bool:
        return self.settled_since is None or since <= self.settled_since

    def hurry(self) -> None:
        self.hurried += 1

    def kill(self, ranks: list[int]) -> None:
        for r in ranks:
            self.procs[r].exitcode = -9


def watch_of(world: FakeWorld, **options: Any) -> Watch:
    return Watch(world, **options)  # type: ignore[arg-type]  # the stand-in has what a watch reads


def test_a_world_runs_on_then_finishes_with_every_result():
    world = FakeWorld(2)
    watch = watch_of(world)
    assert watch.look().outcome is None
    world.post("finished", 0, value="a")
    world.post("finished", 1, value="b")
    look = watch.look()
    assert [e["event"] for e in look.events] == ["finished", "finished"] and look.outcome is None
    for p in world.procs:
        p.exitcode = 0
    assert watch.look().outcome == Finished({0: "a", 1: "b"})


def test_a_rank_gone_without_a_report_is_lost_before_any_error():
    world = FakeWorld(3)
    watch = watch_of(world, error_grace_s=0.0)
    world.post("error", 0, message="ValueError: peer gone", traceback="tb")
    world.procs[0].exitcode = 1
    world.procs[2].exitcode = -9  # its machine went away; rank 0's error followed from it
    assert watch.look().outcome == Lost(((2, -9),), machine=False)
    world.procs[2].machine_lost = True
    assert watch.look().outcome == Lost(((2, -9),), machine=True)


def test_an_error_fails_the_world_after_its_grace_once_every_machine_has_answered():
    world = FakeWorld(2)
    world.settled_since = 0.0  # no machine has answered since anything recent
    watch = watch_of(world, error_grace_s=0.05, settle_timeout_s=60)
    world.post("error", 1, message="ValueError: bad", traceback="Traceback: bad")
    assert watch.look().outcome is None and world.hurried == 1  # the world is ending: exits are awaited
    time.sleep(0.1)
    assert watch.look().outcome is None  # past the grace, but a machine may yet turn out lost
    world.settled_since = float("inf")
    assert watch.look().outcome == Failed(1, "ValueError: bad", "Traceback: bad")


def test_an_error_fails_the_world_at_once_when_every_rank_has_exited():
    world = FakeWorld(2)
    watch = watch_of(world, error_grace_s=60)
    world.post("error", 1, message="boom")
    world.procs[1].exitcode = 1
    assert watch.look().outcome is None
    world.procs[0].exitcode = 1
    world.post("error", 0, message="peer boom")
    assert watch.look().outcome == Failed(0, "peer boom", "")  # the lowest rank that reported


def test_an_error_that_a_peer_caused_comes_after_the_peers_own():
    from thrifty.runtime.worlds.rank import broken_by_peer

    world = FakeWorld(2)
    watch = watch_of(world, error_grace_s=60)
    world.post("error", 0, message="RuntimeError: Connection closed by peer", peer=True)
    world.post("error", 1, message="KeyError: 'no such column'")
    world.procs[0].exitcode = world.procs[1].exitcode = 1
    assert watch.look().outcome == Failed(1, "KeyError: 'no such column'", "")
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:58597")
    wrapped = ValueError("job 'm:f' raised RuntimeError")
    wrapped.__cause__ = gloo
    assert broken_by_peer(gloo) and broken_by_peer(wrapped) and not broken_by_peer(KeyError("no such column"))


def test_an_exit_without_a_report_after_a_lost_store_is_not_a_loss():
    world = FakeWorld(2)
    watch = watch_of(world)
    world.store_failed = "DistStoreError: connection reset"  # rank 0's machine hosted it
    world.procs[1].exitcode = 1  # exited on the collective error: no loss of its own
    assert watch.look().outcome is None
    world.procs[0].exitcode = -9
    assert watch.look().outcome == Lost(((0, -9),))


def test_ranks_killed_on_purpose_are_not_lost_and_killing_all_ends_the_world():
    world = FakeWorld(2)
    watch = watch_of(world)
    watch.kill([1])
    assert world.procs[1].exitcode == -9 and watch.look().outcome is None
    watch.kill([0], as_loss=True)  # a fault injector taking the machine away
    assert watch.look().outcome == Lost(((0, -9),))
    other = FakeWorld(2)
    watch = watch_of(other)
    watch.kill()
    assert watch.look().outcome == Killed()


class WorldLosingAMachine(FakeWorld):
    """Rank 1's machine is gone, but its launcher does not know it yet: a
    kill cannot reach the rank, and its exit code comes when the launcher
    learns of the loss (`learn`)."""

    def kill(self, ranks: list[int]) -> None:
        super().kill([r for r in ranks if r != 1])

    def learn(self) -> None:
        self.procs[1].exitcode, self.procs[1].machine_lost = -9, True


def test_a_kill_that_follows_a_lost_machine_does_not_hide_the_loss():
    """The starter may hear that a machine went (the provider's feed) before
    its launcher does, and kill the whole world: its ranks there are still
    lost, and the world waits for their exits before it says how it ended."""
    world = WorldLosingAMachine(3)
    watch = watch_of(world)
    watch.kill()
    assert watch.look().outcome is None  # rank 1's exit is not known yet: not `Killed`
    world.learn()
    assert watch.look().outcome == Lost(((1, -9),), machine=True)
    world = WorldLosingAMachine(2)
    watch = watch_of(world)
    world.learn()
    watch.kill([1])  # killed on purpose after its machine went: still a loss
    assert watch.look().outcome == Lost(((1, -9),), machine=True)
    world = WorldLosingAMachine(2)
    watch = watch_of(world, settle_timeout_s=0.0)
    watch.kill()
    assert watch.look().outcome is None
    time.sleep(0.01)
    assert watch.look().outcome == Killed()  # no exit came within the settle timeout


def test_a_gone_fork_server_ends_the_world():
    world = FakeWorld(2)
    watch = watch_of(world)
    world.procs[0].exitcode = 0
    world.server_alive = False
    assert watch.look().outcome == ServerGone()


def test_the_stall_clock_restarts_on_progress_and_signs_and_stops_when_unset():
    world = FakeWorld(1)
    seen: list[str] = []
    watch = watch_of(world, stall_timeout_s=5.0, progress_ranks=(0,),
                     on_event=lambda e: (seen.append(e["event"]), watch.sign()))

    def quiet_for(seconds: float) -> None:  # as if nothing had come for that long (no sleeping)
        watch.last_sign = time.monotonic() - seconds

    quiet_for(10)
    world.progress_of[0] = (1, time.time())
    look = watch.look()
    assert look.progressed and look.outcome is None and watch.progress[0][0] == 1
    quiet_for(10)
    world.post("checkpoint", 0)  # the starter's sign of life, taken before the look's outcome
    assert watch.look().outcome is None and seen == ["checkpoint"]
    quiet_for(10)
    outcome = watch.look().outcome
    assert isinstance(outcome, Stalled) and outcome.seconds >= 10
    watch.stall_timeout_s = None  # e.g. awaiting the starter's decision
    assert watch.look().outcome is None


@pytest.mark.parametrize("kind", ["done", "stopped"])
def test_the_starters_ending_events_hurry_the_launcher_once(kind):
    world = FakeWorld(1)
    watch = watch_of(world, ending_events=("error", "done", "stopped"))
    world.post(kind, 0)
    world.post(kind, 0)
    watch.look()
    watch.look()
    assert world.hurried == 1
