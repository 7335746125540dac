"""The segment watch: the driver's side of one world of workers, from its launch to its end.

It polls the world (`launcher.Segment`) and the run's interruption feed
(`thrifty.runtime.providers.interruptions`), logs what the workers did
(checkpoints, the world formed, metrics, throughput), feeds the progress
monitor, and reacts:

- to the feed: a `CapacityChange` depletes its market; `Notice`s and
  `MachineLost`s of this world's machines stop it (gracefully while every
  machine going has time left; a machine still running when its warning
  runs out is killed) and re-plan (`replan.ReplanPolicy` says when and from
  which iteration). The sources pushed into the feed here are the world's
  own: a notice planted in a worker (driver -> rank -> driver), ranks gone
  without notice, and the fault injector's time-triggered kills and notices;
  the provider's notices are pulled from it;
- to the monitor: a slowdown re-plans (when the policy says so);
- to Ctrl-C: the workers checkpoint and stop.

It works on the run through `WatchedRun`, the public surface of the driver
(`driver._Driver`): announce an interruption, solve a re-plan, commit it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from thrifty.core.validation import json_object
from thrifty.runtime.metrics import Metrics
from thrifty.runtime.events import Preemption
from thrifty.runtime.providers.base import Machine
from thrifty.runtime.providers.interruptions import CapacityChange, FeedReader, Interruption, MachineLost, Notice
from thrifty.perfmodels.cluster import MachineGroup
from thrifty.runtime.training.calibration import OnlineCalibrator
from thrifty.runtime.training.config import RunConfig
from thrifty.runtime.training.errors import ReplanInfeasible, TrainingError
from thrifty.runtime.training.faults import FaultInjector
from thrifty.runtime.training.hooks import Hooks
from thrifty.runtime.training.launcher import RankSlot, Segment, SegmentPoll
from thrifty.runtime.training.monitor import ProgressMonitor, ThroughputWindow, projected_cost
from thrifty.runtime.training.records import SegmentRecord
from thrifty.runtime.training.replan import Replan, ReplanPolicy
from thrifty.runtime.training.runlog import RunLog
from thrifty.solver.plan import Plan
from thrifty.solver.problem import TrainingProblem

__all__ = ["SegmentWatch", "WatchedRun", "SAME_INTERRUPT_S"]

SAME_INTERRUPT_S = 1.0  # a second SIGINT sooner than this after the first is the same Ctrl-C


class WatchedRun(Protocol):
    """What a segment watch uses of the run it watches."""

    config: RunConfig
    problem: TrainingProblem
    log: RunLog
    hooks: Hooks
    monitor: ProgressMonitor
    injector: FaultInjector
    policy: ReplanPolicy
    interruptions: FeedReader
    machines: dict[str, Machine]  # every machine of the run, by id
    segments: list[SegmentRecord]  # this session's, the last one ended last
    start: float  # the run's clock: Unix seconds at its start
    done: int  # the iteration the next world starts from
    launch_s: float  # the longest launch seen (the switching overhead of a re-plan)
    metrics: dict[str, Any] | None  # the last loss and metrics record written (`SegmentWatch._metrics`)
    metrics_out: Metrics  # where every reported loss and metric goes (metrics.jsonl, TensorBoard, MLflow)
    throughput_log_s: float
    calibrator: OnlineCalibrator  # the models corrected online

    def announce(self, event: Preemption, **extra: Any) -> None:
        """Record an interruption: deplete its market, log it, tell the hooks."""

    def solve(self, reason: str, plan: Plan, remaining: int, event: Preemption | None = None,
              event_at: float | None = None, gone: Iterable[str] = ()) -> Replan:
        """Re-solve for `remaining` iterations; machines in `gone` are not survivors."""

    def commit(self, replan: Replan) -> Plan:
        """Make a re-plan the plan in force; returns its plan."""

    def give_back(self, machines: Sequence[Machine]) -> None:
        """Terminate machines the run no longer uses."""

    def report(self, now: float, state: str, plan: Plan) -> None:
        """Tell the progress callback where the run is."""

    def check_prediction(self, segment: int, plan: Plan, slots: Sequence[RankSlot], reached: int, start: int,
                         window: ThroughputWindow | None) -> None:
        """Say (once a run) when the steady iteration time is off the plan's prediction."""

    def forecast(self, remaining: int, now: float) -> tuple[TrainingProblem, list[dict[str, Any]]] | None:
        """Whether any plan meets what is left with the corrected models (`replan.Replanner.forecast`)."""


def _left(limits: Any) -> str:
    parts = [f"{limits.time_s:.1f} s" if limits.time_s is not None else "",
             f"${limits.cost_usd:.4f}" if limits.cost_usd is not None else ""]
    return " and ".join(p for p in parts if p) + " left"


class SegmentWatch:
    """The driver's side of one segment: reacts to each poll."""

    def __init__(self, run: WatchedRun, plan: Plan, slots: list[RankSlot], index: int, acquire_at: float):
        self.d, self.plan, self.slots, self.index, self.acquire_at = run, plan, slots, index, acquire_at
        self.ours = {s.machine_id for s in slots}
        self.segment: Segment = None  # type: ignore[assignment]
        self.next_plan: Plan | None = None
        self.failure: BaseException | None = None
        self.handled: set[str] = set()  # machines already preempted
        self.kill_at: dict[str, float] = {}  # machine id -> when its warning runs out
        self.start = self.reached = run.done
        self.first_progress_at: float | None = None
        self.last_throughput_log = 0.0
        self.timing: dict | None = None
        # the last iteration an earlier world wrote metrics for (read at this world's first poll): this world
        # replays those after its checkpoint, and their records are dropped (the earlier world's are kept)
        self.written: int | None = None
        self._metrics_polled = False
        catalog = run.calibrator.catalog
        self.groups = [MachineGroup(catalog.get(a.instance_type), a.count, a.batch_per_instance)
                       for a in plan.allocation]

    def machine_of(self, machine_id: str) -> Machine:
        return self.d.machines[machine_id]

    def follow(self) -> str:
        try:
            return self._follow()
        except KeyboardInterrupt:
            self._stop_on_interrupt()
            raise

    def _stop_on_interrupt(self) -> None:
        """Ctrl-C: ask the workers to checkpoint and stop, and wait for them up
        to the stop timeout; a second Ctrl-C stops waiting (the workers are
        then killed and the run resumes from its last checkpoint). A SIGINT
        within `SAME_INTERRUPT_S` of the first is the same one delivered twice
        (to the process and to its process group, as ``timeout`` does)."""
        seg, d = self.segment, self.d
        if seg is None:
            return
        first = time.monotonic()
        deadline = first + d.config.stop_timeout_s
        try:
            seg.request_stop()
        except Exception:  # noqa: BLE001 - a failure while stopping: the workers are killed on exit
            return
        while time.monotonic() < deadline:
            try:
                if self._stopped_after_interrupt(seg):
                    return
                time.sleep(d.config.poll_s)
            except KeyboardInterrupt:
                if time.monotonic() - first >= SAME_INTERRUPT_S:
                    return
            except Exception:  # noqa: BLE001 - a failure while stopping: the workers are killed on exit
                return

    def _stopped_after_interrupt(self, seg: Segment) -> bool:
        d = self.d
        try:
            poll = seg.poll()
        finally:
            self._metrics(seg.take_records())
        self._worker_events(poll)
        if poll.iteration is not None:
            self.reached = max(self.reached, poll.iteration)
            d.monitor.iterations = max(d.monitor.iterations, poll.iteration)
        return bool(poll.ended or poll.lost)

    def _follow(self) -> str:
        d, seg = self.d, self.segment
        while True:
            try:
                poll = seg.poll()
            finally:  # the records a poll read, also when it raised (a worker failed)
                self._metrics(seg.take_records())
            now = time.time()
            self._worker_events(poll)
            self._react(d.interruptions.poll(self.ours, pull=False))  # a notice a worker passed on
            if poll.clocks:
                d.calibrator.observe(poll.clocks, now)
            if poll.iteration is not None and poll.iteration_at is not None:
                if self.first_progress_at is None and poll.iteration > d.done:
                    self.first_progress_at = poll.iteration_at
                    d.launch_s = max(d.launch_s, poll.iteration_at - self.acquire_at)
                self.reached = max(self.reached, poll.iteration)
                d.monitor.observe(poll.iteration_at, poll.iteration)
            if poll.lost:
                self._lost(poll.lost)
                return "lost"
            if poll.ended:
                return poll.ended
            self._inject(now)
            self._react(d.interruptions.poll(self.ours))  # the provider's notices and the injector's
            for machine_id, deadline in list(self.kill_at.items()):
                if now >= deadline:  # the warning ran out: the machine goes, stopped or not
                    seg.kill(seg.ranks_of(machine_id), as_loss=True)
                    del self.kill_at[machine_id]
            if poll.formed and seg.stop_requested_at is None:
                self._check_progress(now)
            self._report(now, "stopping" if seg.stop_requested_at is not None else
                         "training" if poll.formed else "launching")
            time.sleep(d.config.poll_s)

    def _metrics(self, records: list[dict[str, Any]]) -> None:
        """Every loss and metrics record a poll read to the run's metrics
        (metrics.jsonl, TensorBoard, MLflow), once each and in iteration
        order: a record of an iteration an earlier world already wrote (one
        replayed after a re-plan from an earlier checkpoint, or by a resumed
        run's first world) is dropped. The
        last one written is the run's latest (progress line) and goes to the
        run log."""
        d, last = self.d, None
        if not self._metrics_polled:
            self._metrics_polled, self.written = True, d.metrics_out.last_step
        for record in records:
            iteration = int(record.get("iteration") or 0)
            if self.written is not None and iteration <= self.written:
                continue
            values: dict[str, Any] = {"loss": record.get("loss"), **(record.get("metrics") or {})}
            d.metrics_out.write(iteration, values)  # a loss of None (a loop that reports none) is left out
            last = record
        if last is not None:
            d.metrics = last
            d.log.write("metrics", at=last.get("at"), segment=self.index, iteration=last.get("iteration"),
                        loss=last.get("loss"), metrics=last.get("metrics", {}))

    def _worker_events(self, poll: SegmentPoll) -> None:
        d = self.d
        for e in poll.events:
            kind = e["event"]
            if kind == "checkpoint":
                d.log.write("checkpoint", at=e["at"], segment=self.index, iteration=e["iteration"],
                            save_s=e["save_s"], bytes=e["bytes"])
            elif kind == "ready" and e["rank"] == 0:
                d.log.write("world_formed", at=e["at"], segment=self.index, start_iteration=e["start_iteration"],
                            rng=e["rng"], since_launch_s=e["at"] - self.acquire_at)
                if e["start_iteration"] != self.start:
                    self._found_checkpoint(e["start_iteration"])
            elif kind == "notice":  # planted in a worker by the fault injector, passed back here
                self.reached = max(self.reached, e["iteration"])
                m = self.machine_of(e["machine_id"])
                d.interruptions.feed.push(Preemption(m.instance_type, m.market, "injector", m.id, e["time_left_s"],
                                                     "fault injector: spot notice", at=e["at"]))
            elif kind in ("done", "stopped"):
                self.timing = e.get("timing")

    def _inject(self, now: float) -> None:
        """The fault injector's time-triggered kills that are due: one with no
        warning kills the machine's ranks (their loss shows in a later poll),
        one with a warning is a spot notice in the feed."""
        d, seg = self.d, self.segment
        for action in d.injector.due(now - d.start, 1 + max(s.machine_index for s in self.slots)):
            machine_id = next(s.machine_id for s in self.slots if s.machine_index == action.machine)
            if action.warning_s is None:
                seg.kill(seg.ranks_of(machine_id), as_loss=True)
            else:
                m = self.machine_of(machine_id)
                d.interruptions.feed.push(Preemption(m.instance_type, m.market, "injector", machine_id,
                                                     action.warning_s, "fault injector: spot notice"))

    def _found_checkpoint(self, iteration: int) -> None:
        """The workers started from a later checkpoint than the driver knew of:
        the last world saved it and was killed before it could say so."""
        d = self.d
        if iteration < self.start or not d.segments:
            raise TrainingError(f"segment {self.index} started at iteration {iteration}, but the driver "
                                f"expected {self.start}")
        d.log.write("checkpoint_found", segment=self.index - 1, iteration=iteration, expected=self.start)
        d.segments[-1] = replace(d.segments[-1], committed_iteration=iteration)
        self.start = self.reached = d.done = iteration
        d.monitor.reset(iteration)

    def _react(self, events: Sequence[Interruption]) -> None:
        """A market without capacity is depleted (nothing stops); machines of
        this world going are preempted."""
        for e in events:
            if isinstance(e, CapacityChange):
                self.d.announce(e.preemption, segment=self.index)
        going = [e for e in events if not isinstance(e, CapacityChange)]
        if going:
            self._preempted(going)

    def _preempted(self, events: Sequence[Interruption]) -> None:
        """Machines of this world are being taken away: deplete, stop
        (gracefully while there is time left), re-plan."""
        fresh = [e for e in events if e.machine_id not in self.handled]
        if not fresh:
            return
        d, seg = self.d, self.segment
        graceful = d.policy.graceful(fresh)
        self.handled.update(e.machine_id for e in fresh if e.machine_id is not None)
        restart = d.policy.restart(graceful, self.reached, seg.last_checkpoint, self.start)
        for e in fresh:
            d.announce(e.preemption, segment=self.index, iteration=self.reached, plan_from_iteration=restart)
        if graceful:
            seg.request_stop()
            for e in fresh:
                assert isinstance(e, Notice) and e.machine_id is not None  # what makes the stop graceful
                self.kill_at[e.machine_id] = e.deadline
        else:
            for e in fresh:  # a machine gone now: its ranks are lost, whether or not their exits are seen yet
                if isinstance(e, MachineLost) and e.machine_id is not None:
                    seg.kill(seg.ranks_of(e.machine_id), as_loss=True)
            seg.kill()
        try:
            self.next_plan = d.commit(d.solve("preemption", self.plan, d.problem.iterations - restart,
                                              fresh[0].preemption, gone=self.handled))
        except ReplanInfeasible as e:
            self.failure = e
            seg.request_stop()

    def _lost(self, lost: list[tuple[int, int]]) -> None:
        """Workers gone without notice: their machines are lost."""
        self.segment.kill()
        events: dict[str, Preemption] = {}
        for rank, code in lost:
            slot = self.slots[rank]
            events.setdefault(slot.machine_id, Preemption(
                slot.instance_type, slot.market, "worker-exit", slot.machine_id, 0.0,
                f"rank {rank} exited with code {code} without notice"))
        feed = self.d.interruptions
        feed.feed.push(*events.values())
        self._react(feed.poll(self.ours, pull=False))

    def _check_progress(self, now: float) -> None:
        d = self.d
        verdict = d.monitor.check(now, d.machines.values())
        d.check_prediction(self.index, self.plan, self.slots, self.reached, self.start, verdict.window)
        if d.calibrator.window_due(now, len(self.slots)):
            self._calibrate(now, verdict.spent_usd)
        if now - self.last_throughput_log >= d.throughput_log_s:
            self.last_throughput_log = now
            d.log.write("throughput", at=now, segment=self.index, **json_object(verdict))
        if not d.policy.on_slowdown_verdict(verdict.replan):
            return
        d.monitor.hold_off(now, d.policy.window_s)  # judge again only on a fresh window
        d.log.write("slowdown", at=now, segment=self.index, **json_object(verdict))
        d.hooks.emit("slowdown", verdict)
        try:
            replan: Replan | None = d.solve("slowdown", self.plan, d.problem.iterations - self.reached, event_at=now)
        except ReplanInfeasible as e:
            d.log.write("replan_infeasible", reason="slowdown", error=str(e), assumed=d.calibrator.assumed())
            replan = None
        if not d.policy.switch_on_slowdown(replan, self.plan.config):
            if replan is not None:
                d.log.write("replan_kept", config=self.plan.config, latency_s=replan.latency_s)
            d.monitor.hold_off(now, d.policy.hold_off_s())  # ask again later, and later still each time
            return
        assert replan is not None  # switch_on_slowdown switches only to a plan
        self.next_plan = d.commit(replan)
        self.segment.request_stop()

    def _calibrate(self, now: float, spent_usd: float) -> None:
        """A calibration window ends: correct the models from the workers'
        clock marks (logged, told to the ``calibrated`` hook), then ask the
        corrected models whether the limits can still be met: by the plan in
        force (no switch), else by any plan of what is left (a re-solve); when
        neither, say so now with the least change that admits a plan
        (``infeasible_forecast``; once, and again after a window that was
        feasible)."""
        d, cal = self.d, self.d.calibrator
        event = cal.close_window(now, self.groups, [s.instance_type for s in self.slots])
        if event is None:
            return
        d.log.write("calibration", at=now, segment=self.index, config=self.plan.config, **event)
        d.hooks.emit("calibrated", event)
        remaining = d.problem.iterations - self.reached
        if remaining < 1:
            return
        elapsed = now - d.start
        iteration_s = cal.iteration_s(self.groups)
        kept_s = elapsed + remaining * iteration_s
        kept_usd = d.monitor.spent_before_usd + projected_cost(d.machines.values(), now, d.start + kept_s,
                                                              d.problem.overheads.min_billed_s)
        limits = d.problem.limits
        if (limits.time_s is None or kept_s <= limits.time_s) and (limits.cost_usd is None
                                                                   or kept_usd <= limits.cost_usd):
            cal.infeasible = None
            return
        found: tuple[TrainingProblem | None, list[dict[str, Any]]] | None
        try:
            found = d.forecast(remaining, now)
        except ReplanInfeasible as e:  # the time limit has passed, or the budget is spent
            found = (None, [])
            why = str(e)
        else:
            why = ""
        if found is None:
            cal.infeasible = None
            return  # another plan meets the limits: the slowdown re-plan switches to it when the monitor is sure
        if cal.infeasible is not None:
            return  # said already
        problem, relaxations = found
        if problem is not None:
            why = (f"with the corrected models no plan meets what is left ({remaining} iterations, "
                   f"{_left(problem.limits)})")
        forecast = cal.forecast(relaxations, why, elapsed_s=elapsed, spent_usd=spent_usd, kept_total_s=kept_s)
        d.log.write("infeasible_forecast", segment=self.index, **forecast.to_json())  # when it is said
        d.hooks.emit("infeasible_forecast", forecast)

    def _report(self, now: float, state: str) -> None:
        self.d.report(now, state, self.plan)

    def finish(self, ended: str) -> Plan:
        d, seg = self.d, self.segment
        committed = seg.last_checkpoint if seg.last_checkpoint is not None else self.start
        throughput = None
        if self.timing and self.timing["seconds"] > 0:
            throughput = (self.timing["to_iteration"] - self.timing["from_iteration"]) / self.timing["seconds"]
        corrected = None if d.calibrator.calibration.empty else d.calibrator.iteration_s(self.groups)
        record = SegmentRecord(self.index, self.plan.config, tuple(s.batch for s in self.slots), self.start,
                               self.reached, committed, ended,
                               None if self.first_progress_at is None else self.first_progress_at - self.acquire_at,
                               tuple(c["save_s"] for c in seg.checkpoints), throughput,
                               self.plan.predicted.iteration_s if self.plan.predicted else None, corrected)
        d.segments.append(record)
        d.log.write("segment_end", **json_object(record))
        d.injector.reached(self.reached)
        d.done = committed
        d.give_back([d.machines[m] for m in self.handled if d.machines[m].terminated_at is None])
        if self.failure is not None:
            raise self.failure
        if ended == "finished":
            return self.plan
        if self.next_plan is None:  # stopped or killed without a new plan (stop timeout): same plan again
            return self.plan
        return self.next_plan
