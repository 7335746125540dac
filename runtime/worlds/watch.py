"""Watching a world from the process that started it: the one watcher.

Every starter (a training segment, a tuning trial, a measurement tool's
`World.run`) follows its world the same way: it calls `Watch.look` in its
own loop, never blocking, and gets the world's new events, its ranks' exit
codes and, once the world has come to an end that the starter must act on,
a typed outcome:

- `Lost`: ranks gone without a report (exit code not 0, no ``error``
  event): killed by a signal, or their machine is known gone (the launcher
  says so); a machine taken away without notice looks like this. Ranks the
  starter killed on purpose (`Watch.kill`) are not lost. When the world's
  store went down with rank 0's machine, no rank can report, and only the
  ranks killed by a signal (or on a lost machine) are lost: the others exited
  on the collective error that followed;
- `Killed`: the starter killed every rank on purpose (`Watch.kill`), once
  every rank's exit is known (at most `settle_timeout_s` after the kill): a
  rank on a machine that went may still turn out `Lost`. A kill that follows
  a loss does not hide it: a rank whose machine the launcher knows is gone is
  lost even if the starter killed it too;
- `Failed`: a rank reported an error (the lowest such rank, its message and
  traceback; a rank whose collective broke because a peer left comes after
  the others), once every rank has exited, or `error_grace_s` has passed and
  every machine has answered since the error (`Launcher.settled`; at most
  `settle_timeout_s`): on a cluster, a rank's error may be its peer's
  machine going away, which is then `Lost`;
- `Finished`: every rank exited with code 0 (with the ``finished`` values
  the ranks posted);
- `ServerGone`: the fork server exited while ranks ran (no exit code will
  come any more);
- `Stalled`: no sign of life for `stall_timeout_s`: no progress report moved
  and the starter did not call `sign` (it does on the events that mean
  progress to it). The starter sets `stall_timeout_s` as the world's phase
  asks (None: no stall clock, e.g. while a world awaits a decision).

In that order: the first that holds is the outcome; None while the world
runs on. Whatever the starter does next (raise, re-plan, report a crash,
read the results) is the starter's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from thrifty.runtime.worlds.launcher import RankProcess

__all__ = ["Watch", "Watched", "Look", "Outcome", "Finished", "Failed", "Lost", "Killed", "ServerGone", "Stalled"]


class Watched(Protocol):
    """What the watcher reads of a world (`thrifty.runtime.worlds.World` is
    one): its ranks' processes and exit codes, the events and progress they
    posted to the store, whether the store still answers, and which machines
    are known lost. A Protocol, so that the world (which watches itself with
    a `Watch`) and the watcher do not import each other."""

    procs: list[RankProcess]
    store_failed: str | None

    def kill(self, ranks: Sequence[int] | None = None) -> None: ...
    def exit_codes(self) -> list[int | None]: ...
    def events(self) -> list[dict[str, Any]]: ...
    def progress(self, rank: int = 0) -> tuple[int, float] | None: ...
    def hurry(self) -> None: ...
    def machines_lost(self) -> list[int]: ...
    def settled(self, since: float) -> bool: ...

    @property
    def server_alive(self) -> bool: ...


@dataclass(frozen=True)
class Finished:
    """Every rank exited with code 0; `results`: the ``finished`` value of each rank that posted one."""

    results: dict[int, Any]


@dataclass(frozen=True)
class Failed:
    """Rank `rank` reported an error: `reason` (its message), `details` (its traceback)."""

    rank: int
    reason: str
    details: str = ""


@dataclass(frozen=True)
class Lost:
    """Ranks gone without a report, as ``(rank, exit code)``; `machine`: the
    launcher knows the machine of one of them is gone."""

    ranks: tuple[tuple[int, int], ...]
    machine: bool = False


@dataclass(frozen=True)
class Killed:
    """The starter killed every rank on purpose."""


@dataclass(frozen=True)
class ServerGone:
    """The fork server exited while ranks ran."""


@dataclass(frozen=True)
class Stalled:
    """No sign of life for `seconds` (past the watch's `stall_timeout_s`)."""

    seconds: float


Outcome = Finished | Failed | Lost | Killed | ServerGone | Stalled


@dataclass
class Look:
    """One look at a world: the events since the last look, every rank's
    exit code (None: running), whether a progress report moved, and the
    outcome (None while the world runs on)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    codes: list[int | None] = field(default_factory=list)
    progressed: bool = False
    outcome: Outcome | None = None


class Watch:
    """The starter's watcher of one world (see the module docstring).

    progress_ranks: the ranks whose progress reports are read at each look
        (each a store read: a world whose rank 0 speaks for all reads one);
        `progress` holds each one's last ``(count, unix time)``.
    ending_events: event kinds after which the world is ending: the
        launcher is hurried (`Launcher.hurry`) to learn the exits promptly.
    on_event: the starter's bookkeeping, called with each new event before
        the look's outcome is decided (so that an event can be a sign of
        life, or change the stall clock, in the look that reads it).
    """

    def __init__(self, world: Watched, *, error_grace_s: float = 1.0, settle_timeout_s: float = 600.0,
                 stall_timeout_s: float | None = None, progress_ranks: Sequence[int] = (),
                 ending_events: Sequence[str] = ("error",),
                 on_event: Callable[[dict[str, Any]], None] | None = None):
        self.world = world
        self.on_event = on_event
        self.error_grace_s, self.settle_timeout_s = error_grace_s, settle_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.progress_ranks = tuple(progress_ranks)
        self.ending_events = frozenset(ending_events)
        self.errors: dict[int, dict[str, Any]] = {}  # the first error event of each rank
        self.results: dict[int, Any] = {}  # each rank's finished value
        self.progress: dict[int, tuple[int, float]] = {}
        self.last_sign = time.monotonic()
        self._error_seen_at: float | None = None
        self._ending = False
        self._expected: set[int] = set()  # ranks the starter killed on purpose
        self._killed = False
        self._killed_at: float | None = None

    # -- what the starter does -------------------------------------------------------------
    def sign(self) -> None:
        """A sign of life: the stall clock starts again."""
        self.last_sign = time.monotonic()

    def kill(self, ranks: Sequence[int] | None = None, as_loss: bool = False) -> None:
        """SIGKILL the given ranks (default: all) that still run. They are
        not `Lost`, unless `as_loss` (a fault injector taking a machine
        away, which must look like the real thing); killing all on purpose
        ends the world `Killed`."""
        for rank, proc in enumerate(self.world.procs):
            if (ranks is None or rank in ranks) and proc.exitcode is None:
                self.world.kill([rank])
                if not as_loss:
                    self._expected.add(rank)
        if ranks is None and not as_loss:
            self._killed = True

    # -- looking -------------------------------------------------------------------------------
    def look(self) -> Look:
        """What the world did since the last look (never blocks long)."""
        out = Look(events=self._events())
        out.progressed = self._read_progress()
        out.codes = self.world.exit_codes()
        if any(c not in (None, 0) for c in out.codes):
            out.events += self._events()  # an error report may have landed just before the exit
        out.outcome = self._outcome(out.codes, time.monotonic())
        return out

    def _events(self) -> list[dict[str, Any]]:
        events = self.world.events()
        for e in events:
            kind = e.get("event")
            if kind == "error":
                self.errors.setdefault(e["rank"], e)
            elif kind == "finished":
                self.results[e["rank"]] = e.get("value")
            if kind in self.ending_events and not self._ending:
                self._ending = True
                self.world.hurry()  # the world is ending: its exits are what the starter waits for now
            if self.on_event is not None:
                self.on_event(e)
        return events

    def _read_progress(self) -> bool:
        moved = False
        for rank in self.progress_ranks:
            progress = self.world.progress(rank)
            if progress is not None and progress != self.progress.get(rank):
                self.progress[rank] = progress
                moved = True
        if moved:
            self.sign()
        return moved

    def _outcome(self, codes: list[int | None], now: float) -> Outcome | None:
        lost = self._lost(codes)
        if lost:
            gone = set(self.world.machines_lost())
            return Lost(tuple(lost), machine=any(r in gone for r, _ in lost))
        if self._killed:
            if self._killed_at is None:
                self._killed_at = now
            if (all(c is not None for c in codes) or not self.world.server_alive
                    or now - self._killed_at > self.settle_timeout_s):
                return Killed()
            return None
        if self.errors:
            if self._error_seen_at is None:
                self._error_seen_at = now
            waited = now - self._error_seen_at
            if (all(c is not None for c in codes) or waited >= self.error_grace_s
                    and (self.world.settled(self._error_seen_at) or waited > self.settle_timeout_s)):
                # an error of a collective broken by a peer that left follows from the peer's: report the cause
                rank = min(self.errors, key=lambda r: (bool(self.errors[r].get("peer")), r))
                error = self.errors[rank]
                return Failed(rank, str(error.get("message", "")), error.get("traceback") or "")
            return None
        if all(c == 0 for c in codes):
            return Finished(dict(self.results))
        if any(c is None for c in codes) and not self.world.server_alive:
            return ServerGone()
        if self.stall_timeout_s is not None and now - self.last_sign > self.stall_timeout_s:
            return Stalled(now - self.last_sign)
        return None

    def _lost(self, codes: list[int | None]) -> list[tuple[int, int]]:
        """Ranks gone without a report (see the module docstring)."""
        gone = set(self.world.machines_lost())
        failed = self.world.store_failed is not None
        return [(r, c) for r, c in enumerate(codes)
                if c is not None and c != 0
                and (r in gone or (r not in self._expected and r not in self.errors and (not failed or c < 0)))]
