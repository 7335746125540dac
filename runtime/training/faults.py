"""A fault injector for tests and demos: preemptions with a simulated
two-minute warning or none, slow machines, machines that boot late.

Faults name a machine by its index in the running plan's machine list
(allocation order, 0-based; after a re-plan the list is the new plan's):

- ``KillWorker(machine, at_iteration=... | at_time_s=..., warning_s=None)``:
  the machine is taken away. With no warning its workers die at once
  (SIGKILL): at an iteration, each of its workers kills itself once that many
  iterations are done (exactly there, whatever the polling); at a time, the
  driver kills them. The runtime then sees workers gone without notice
  (``Preemption(source="worker-exit")``) and restarts from the last
  checkpoint. With ``warning_s`` (EC2 gives 120 s) a spot notice comes first
  (``Preemption(source="injector", time_left_s=warning_s)``), the runtime
  checkpoints and stops, and the machine is killed when the warning runs out
  if it still runs.
- ``SlowWorker(machine, from_iteration, until_iteration=None, extra_s)``: each
  iteration of that machine's workers takes `extra_s` longer, for a while
  (transient) or to the end (persistent, ``until_iteration=None``).
- ``DelayStart(machine, seconds, segment=0)``: the machine's workers join the
  world late (a slow boot); longer than the world timeout, the world fails to
  form.

Each kill fires once: it is spent when the run gets past its iteration or time.

A fault the run cannot have is bad input, said before the run starts
(`fault_problems`, called by `preflight.check_run`): a machine index the
starting plan does not have, an iteration at or past the run's last, a time
past its time limit or before where a resumed run's clock already is.
(Before, such a fault was silently never injected.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from thrifty.core.errors import ProblemError
from thrifty.runtime.ddp.job import WorkerFault
from thrifty.runtime.training.launcher import RankSlot
from thrifty.solver.plan import Plan
from thrifty.solver.problem import TrainingProblem

__all__ = ["KillWorker", "SlowWorker", "DelayStart", "Fault", "FaultInjector", "describe_fault", "fault_problems"]


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ProblemError(message)


@dataclass(frozen=True)
class KillWorker:
    machine: int
    at_iteration: int | None = None
    at_time_s: float | None = None
    warning_s: float | None = None

    def __post_init__(self) -> None:
        _check(self.machine >= 0, f"machine is {self.machine}, but must be 0 or more")
        _check((self.at_iteration is None) != (self.at_time_s is None),
               "give exactly one of at_iteration and at_time_s")
        _check(self.at_iteration is None or self.at_iteration >= 1,
               f"at_iteration is {self.at_iteration}, but must be at least 1")
        _check(self.at_time_s is None or self.at_time_s >= 0, f"at_time_s is {self.at_time_s}, but must be >= 0")
        _check(self.warning_s is None or self.warning_s >= 0, f"warning_s is {self.warning_s}, but must be >= 0")


@dataclass(frozen=True)
class SlowWorker:
    machine: int
    from_iteration: int
    extra_s: float
    until_iteration: int | None = None

    def __post_init__(self) -> None:
        _check(self.machine >= 0, f"machine is {self.machine}, but must be 0 or more")
        _check(self.extra_s > 0, f"extra_s is {self.extra_s}, but must be positive")
        _check(self.until_iteration is None or self.until_iteration > self.from_iteration,
               f"until_iteration {self.until_iteration} must be after from_iteration {self.from_iteration}")


@dataclass(frozen=True)
class DelayStart:
    machine: int
    seconds: float
    segment: int = 0


Fault = KillWorker | SlowWorker | DelayStart


def describe_fault(fault: Fault) -> str:
    """A fault as ``thrifty run --inject`` spells it (``kill:machine=1,iteration=300``)."""
    def num(value: float) -> str:
        return f"{value:g}"

    if isinstance(fault, KillWorker):
        parts = [f"machine={fault.machine}"]
        parts += [f"iteration={fault.at_iteration}"] if fault.at_iteration is not None else []
        parts += [f"time={num(fault.at_time_s)}"] if fault.at_time_s is not None else []
        parts += [f"warning={num(fault.warning_s)}"] if fault.warning_s is not None else []
        return "kill:" + ",".join(parts)
    if isinstance(fault, SlowWorker):
        until = f",until={fault.until_iteration}" if fault.until_iteration is not None else ""
        return f"slow:machine={fault.machine},from={fault.from_iteration},extra={num(fault.extra_s)}{until}"
    return f"delay_start:machine={fault.machine},seconds={num(fault.seconds)},segment={fault.segment}"


def fault_problems(faults: Iterable[Fault], plan: Plan, problem: TrainingProblem,
                   elapsed_s: float = 0.0) -> list[ProblemError]:
    """Each fault that names what the run cannot have, as a `ProblemError`
    (path ``inject``) naming the fault and what exists: a machine past the
    starting plan's machines (numbered in allocation order), an iteration at
    or past the problem's last, a time past the time limit, or one before
    `elapsed_s`, where a resumed run's clock already is."""
    machines = [f"{a.instance_type} ({a.market})" for a in plan.allocation for _ in range(max(a.count, 0))]
    have = (f"the plan has {len(machines)} machine{'s' if len(machines) != 1 else ''}: "
            + ", ".join(f"{i} {m}" for i, m in enumerate(machines)))
    out = []
    for fault in faults:
        def bad(message: str) -> None:
            out.append(ProblemError(f"{describe_fault(fault)}: {message}", path="inject"))  # noqa: B023

        if fault.machine >= len(machines):
            bad(f"there is no machine {fault.machine}; {have}")
        iteration = fault.at_iteration if isinstance(fault, KillWorker) else \
            fault.from_iteration if isinstance(fault, SlowWorker) else None
        if iteration is not None and iteration >= problem.iterations:
            bad(f"iteration {iteration} is not inside the run: it has {problem.iterations} iterations "
                f"(a fault may name iteration {problem.iterations - 1} at most)")
        at = fault.at_time_s if isinstance(fault, KillWorker) else None
        limit = problem.limits.time_s
        if at is not None and limit is not None and at >= limit:
            bad(f"time {at:g} s is at or past the run's time limit of {limit:g} s")
        if at is not None and at < elapsed_s:
            bad(f"time {at:g} s has passed: the resumed run's clock is at {elapsed_s:.1f} s")
    return out


@dataclass(frozen=True)
class DriverAction:
    """What the driver must do now for a time-triggered kill."""

    machine: int
    warning_s: float | None  # None: kill at once; else deliver a notice first


class FaultInjector:
    def __init__(self, faults: Iterable[Fault] = ()):
        self.faults = tuple(faults)
        for f in self.faults:
            if not isinstance(f, (KillWorker, SlowWorker, DelayStart)):
                raise ProblemError(f"a fault must be KillWorker, SlowWorker or DelayStart, not {type(f).__name__}")
        self._spent: set[int] = set()

    def _pending_kills(self) -> list[tuple[int, KillWorker]]:
        return [(i, f) for i, f in enumerate(self.faults) if isinstance(f, KillWorker) and i not in self._spent]

    def worker_faults(self, segment: int, slots: Sequence[RankSlot], start_iteration: int) -> tuple[WorkerFault, ...]:
        """The faults the workers of one world inject into themselves."""
        machines = sorted({s.machine_index for s in slots})
        ranks = {m: [s.rank for s in slots if s.machine_index == m] for m in machines}
        out: list[WorkerFault] = []
        for _, f in self._pending_kills():
            if f.at_iteration is None or f.machine not in ranks or f.at_iteration < start_iteration:
                continue
            if f.warning_s is None:
                out += [WorkerFault(r, "kill", f.at_iteration) for r in ranks[f.machine]]
            else:
                out.append(WorkerFault(ranks[f.machine][0], "notice", f.at_iteration, seconds=f.warning_s))
        for fault in self.faults:
            if isinstance(fault, SlowWorker) and fault.machine in ranks:
                out += [WorkerFault(r, "slow", fault.from_iteration, fault.until_iteration, fault.extra_s)
                        for r in ranks[fault.machine]]
            elif isinstance(fault, DelayStart) and fault.segment == segment and fault.machine in ranks:
                out += [WorkerFault(r, "delay_start", seconds=fault.seconds) for r in ranks[fault.machine]]
        return tuple(out)

    def due(self, elapsed_s: float, machines: int) -> list[DriverAction]:
        """Time-triggered kills whose time has come (each fires once)."""
        out = []
        for i, f in self._pending_kills():
            if f.at_time_s is not None and elapsed_s >= f.at_time_s and f.machine < machines:
                self._spent.add(i)
                out.append(DriverAction(f.machine, f.warning_s))
        return out

    def reached(self, iteration: int) -> None:
        """The run got to `iteration`: kills at or before it are spent."""
        for i, f in self._pending_kills():
            if f.at_iteration is not None and f.at_iteration <= iteration:
                self._spent.add(i)
