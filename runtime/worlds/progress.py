"""Waiting on a process by the work it does, not by the wall clock.

A process that starts (a fork server importing torch, a rank joining its
world) needs some seconds of CPU. On a loaded host it gets a share of a core,
and the same start takes many times as long by the wall clock: a wall-clock
timeout sized for a quiet host fails a healthy start on a busy one, and one
sized for the busiest host waits minutes for a process that hung at once.

`wait_for_process` waits for an event of process `pid` and gives up when the
process has spent `cpu_limit_s` seconds of its own CPU time on it (it works,
but more than a start can take: a loop) or has used no CPU at all for
`stall_s` seconds (it sleeps or is blocked: a hang), with a wall-clock
backstop. A process that is starved but runnable still gets CPU time, so it
keeps the wait going however loaded the host. Where the process's CPU time
cannot be read (not Linux), `cpu_limit_s` is a wall-clock limit, as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["cpu_seconds", "wait_for_process", "WaitOutcome"]

SLICE_S = 0.5  # how long one check waits before the process's progress is looked at
WALL_FACTOR = 10.0  # the wall-clock backstop, as a multiple of the CPU limit


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds process `pid` has used (its threads
    included), from ``/proc/PID/stat``; None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return None


class WaitOutcome:
    """How a `wait_for_process` ended: `done`, or why not (`reason`)."""

    def __init__(self, done: bool, reason: str = ""):
        self.done, self.reason = done, reason

    def __bool__(self) -> bool:
        return self.done


def wait_for_process(pid: int, check: Callable[[float], bool], *, cpu_limit_s: float, stall_s: float = 60.0,
                     wall_limit_s: float | None = None) -> WaitOutcome:
    """Call ``check(seconds)`` (it waits up to `seconds` and says whether the
    awaited event happened) until it says so; give up (module docstring) when
    process `pid` has used `cpu_limit_s` CPU seconds since the wait began, or
    none for `stall_s` seconds, or `wall_limit_s` (default: `WALL_FACTOR`
    times `cpu_limit_s`) have passed."""
    start = time.monotonic()
    wall_limit = wall_limit_s if wall_limit_s is not None else WALL_FACTOR * cpu_limit_s
    first = cpu_seconds(pid)
    last_cpu, last_change = first, start
    while True:
        if check(SLICE_S):
            return WaitOutcome(True)
        now = time.monotonic()
        used = cpu_seconds(pid)
        if first is None or used is None:  # its CPU time is not readable (or it has gone): the wall clock
            if now - start >= cpu_limit_s:
                return WaitOutcome(False, f"no answer in {cpu_limit_s:g} s")
            continue
        if used - first >= cpu_limit_s:
            return WaitOutcome(False, f"it used {used - first:.0f} s of CPU time without answering")
        if last_cpu is None or used > last_cpu:
            last_cpu, last_change = used, now
        elif now - last_change >= stall_s:
            return WaitOutcome(False, f"it used no CPU time for {stall_s:g} s (a hang)")
        if now - start >= wall_limit:
            return WaitOutcome(False, f"no answer in {wall_limit:g} s")
