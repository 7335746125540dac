"""Waiting on a process by its own CPU time (`thrifty.runtime.worlds.progress`):
a hang is found by its lack of CPU use, a runaway by its CPU use, whatever the
wall clock says."""

from __future__ import annotations

import subprocess
import sys
import time

from thrifty.runtime.worlds.progress import cpu_seconds, wait_for_process


def _never(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def test_a_process_that_sleeps_is_a_hang_once_it_used_no_cpu_for_the_stall_time():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        started = time.monotonic()
        outcome = wait_for_process(proc.pid, _never, cpu_limit_s=60.0, stall_s=1.0)
        assert not outcome and "no CPU time" in outcome.reason, outcome.reason
        assert time.monotonic() - started < 30  # the stall, not the CPU limit or the backstop, ended it
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_computes_is_given_up_after_its_cpu_limit_not_before():
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        outcome = wait_for_process(proc.pid, _never, cpu_limit_s=0.5, stall_s=600.0, wall_limit_s=600.0)
        assert not outcome and "CPU time" in outcome.reason, outcome.reason
        used = cpu_seconds(proc.pid)
        assert used is not None and used >= 0.5
    finally:
        proc.kill()
        proc.wait()


def test_the_wait_ends_as_soon_as_the_event_happens():
    proc = subprocess.Popen(["sleep", "60"])
    calls = []
    try:
        def third(seconds: float) -> bool:
            calls.append(seconds)
            return len(calls) == 3

        assert wait_for_process(proc.pid, third, cpu_limit_s=60.0, stall_s=60.0)
        assert len(calls) == 3
    finally:
        proc.kill()
        proc.wait()


def test_a_process_whose_cpu_time_cannot_be_read_is_waited_for_by_the_wall_clock():
    assert cpu_seconds(2**22 + 12345) is None  # beyond Linux's pid range: no such process
    outcome = wait_for_process(2**22 + 12345, _never, cpu_limit_s=1.0, stall_s=0.1)
    assert not outcome and "no answer in 1 s" in outcome.reason
