"""The interruption feed: every source of notices and losses, typed, read alike by every reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from thrifty.runtime.events import Preemption
from thrifty.runtime.providers.interruptions import CapacityChange, MachineLost, Notice, interruption
from thrifty.runtime.providers.local import LocalProvider
from thrifty.runtime.training.replan import ReplanPolicy

DEMO_CATALOG = str(Path(__file__).resolve().parent.parent / "datasets" / "examples" / "local-demo-catalog.json")


def test_a_local_notice_a_loss_and_a_pushed_market_reach_every_reader_typed():
    with LocalProvider("feed", catalog=DEMO_CATALOG) as provider:
        a, b = provider.provision("local-a", 2, "spot")
        driver, executor = provider.interruptions.reader(), provider.interruptions.reader()
        notice = provider.interrupt(a.id, time_left_s=120.0)
        lost = provider.interrupt(b.id, time_left_s=0.0)
        provider.interruptions.push(Preemption("local-b", "spot", "capacity", reason="no capacity"))
        got = driver.poll()
        assert [type(e) for e in got] == [CapacityChange, Notice, MachineLost]  # what was pushed, then pulled
        assert got[1].preemption == notice and got[1].deadline == pytest.approx(notice.at + 120.0)
        assert got[2].preemption == lost and got[2].key == ("local-a", "spot")
        assert executor.poll() == got  # the other reader sees the same events
        assert driver.poll() == [] and executor.poll() == []  # each once
        assert provider.poll_interruptions() == []  # the provider's own queue was drained into the feed


def test_a_reader_keeps_to_its_machines_and_may_leave_the_provider_unasked():
    with LocalProvider("feed", catalog=DEMO_CATALOG) as provider:
        a, b = provider.provision("local-a", 2, "spot")
        reader = provider.interruptions.reader()
        provider.interrupt(a.id, time_left_s=30.0)
        provider.interruptions.push(Preemption("local-a", "spot", "worker-exit", b.id, 0.0, "rank 1 exited"))
        assert [e.machine_id for e in reader.poll({b.id}, pull=False)] == [b.id]  # the notice stays queued
        assert reader.poll({b.id}) == []  # pulled now, and of a machine the reader does not run on
        provider.interrupt(a.id, time_left_s=30.0)
        assert [e.machine_id for e in reader.poll({a.id})] == [a.id]


def test_an_unknown_warning_is_a_loss_and_the_policy_stops_gracefully_only_on_notices():
    unknown = interruption(Preemption("t", "spot", "describe", "m", None))
    notice = interruption(Preemption("t", "spot", "imds", "n", 120.0))
    assert isinstance(unknown, MachineLost) and isinstance(notice, Notice)
    assert ReplanPolicy.graceful([notice]) and not ReplanPolicy.graceful([notice, unknown])
    assert ReplanPolicy.restart(True, reached=7, last_checkpoint=5, start=2) == 7
    assert ReplanPolicy.restart(False, reached=7, last_checkpoint=5, start=2) == 5
    assert ReplanPolicy.restart(False, reached=7, last_checkpoint=None, start=2) == 2
