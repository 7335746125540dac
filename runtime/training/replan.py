"""Re-solving a running job with what is left (Srifty 4.5, 5.4): when, and with what.

**When** (`ReplanPolicy`, asked by the segment watch, `watch.SegmentWatch`):

- a *preemption* (a `Notice` or a `MachineLost` from the interruption feed,
  `thrifty.runtime.providers.interruptions`): always. When every machine
  going has time left (all notices) the workers checkpoint and stop after
  the iteration they are in, and the re-plan is for what is left after the
  iteration reached; otherwise they are killed and it is for what is left
  after the last checkpoint (`ReplanPolicy.restart`);
- a launch that fails for *capacity*: always, from where the run is;
- a market that loses capacity while the run goes on (`CapacityChange`):
  it is depleted, nothing stops, no re-plan;
- a *slowdown* (the progress monitor says the limits will be missed with
  high certainty): when `replan_on_slowdown`, and the new plan is switched
  to only when it is a different configuration; one that changes nothing
  (the same configuration, or none meets the limits) is asked for again
  only after a hold-off that doubles each time (`slowdown_hold_off_s`).

**With what** (`Replanner`):

When a spot machine is preempted (or a launch fails for capacity) its
(instance type, market) is *depleted*: no new machine of it is chosen again.
The re-plan problem is the original one with

    iterations  = N - n           (n: where the run restarts)
    time_s      = T_lim - t       (t: elapsed since the run started)
    cost_usd    = $_lim - c       (c: spent so far, per-second billing)
    launch_s    = the switching overhead (at least the problem's own)
    instances   = the depleted choices limited to the machines of them that
                  still run (removed when none does); the others unchanged.

Keeping the survivors of a depleted market follows Srifty 5.4, where the
surviving p3.8xlarge spot machine went on with 8 new g3.8xlarge
(1024 = 512 + 8 x 64); new machines of that market are never asked for.
The solver's launch overhead is charged to the whole plan, survivors
included, which makes the re-plan slightly conservative.

The problem is solved with the original `TrainingSpace`'s simulator and
caches (`TrainingSpace.derive`), under a solver time limit (Srifty gives
itself 1 s); the latency from the event to the new plan is measured.

**Best effort** (``replan(..., best_effort=True)``, what the driver asks
after a preemption or a capacity failure): when no plan meets what is left
of the time limit (it has passed, or the remaining iterations cannot fit),
the job is re-solved without the time limit for the least time within what
is left of the budget, and the run goes on to finish late (``thrifty run``
exits 4, saying by how much) rather than stop with its work half done. The
paper does not say what Srifty does when no configuration meets the
constraints; a slowdown that leaves no plan already goes on as planned, and
this treats a preemption alike. With no budget left, or no machine choice
left, it is `ReplanInfeasible` as before.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Annotated, Any, Protocol

from pydantic import Field, SerializerFunctionWrapHandler, computed_field, field_serializer, model_serializer
from pydantic.dataclasses import dataclass

from thrifty.core.validation import RECORD_CONFIG, without_unset
from thrifty.runtime.events import Preemption
from thrifty.runtime.providers.interruptions import Interruption, Notice
from thrifty.runtime.training.errors import ReplanInfeasible
from thrifty.solver.plan import Plan
from thrifty.solver.problem import Limits, Overheads, TrainingProblem
from thrifty.solver.solve import search_space, solve
from thrifty.solver.training import TrainingSpace

__all__ = ["Replan", "replan_changes", "Replanner", "ReplanPolicy", "slowdown_hold_off_s"]

Key = tuple[str, str]
MAX_HOLD_OFF_WINDOWS = 8


def slowdown_hold_off_s(window_s: float, fruitless_replans: int) -> float:
    """How long the monitor holds off after `fruitless_replans` slowdown
    re-plans in a row that changed nothing: one window after the first, then
    twice as long after each, at most `MAX_HOLD_OFF_WINDOWS` windows (a
    persistent slowdown with no better plan is then re-solved, and logged,
    a few times in a short job, not every window)."""
    return window_s * min(2 ** max(0, fruitless_replans - 1), MAX_HOLD_OFF_WINDOWS)


@dataclass(frozen=True, config=RECORD_CONFIG)
class Replan:
    """One re-plan: why, what ran before, what runs now, how long it took.

    Its JSON is the ``replan`` event of the run log
    (`thrifty.core.validation.json_object`): the old plan by its
    configuration (``old_config``), the new one whole (``plan``) and by its
    configuration, the event as ``trigger``, and of the re-plan problem what
    changed (``iterations``, ``limits``, ``launch_s``, ``instances``)."""

    reason: str  # "preemption", "capacity" or "slowdown"
    old_plan: Annotated[Plan | None, Field(exclude=True)]
    new_plan: Annotated[Plan, Field(serialization_alias="plan")]
    problem: TrainingProblem
    latency_s: float  # from the event to the new plan
    solve_s: float
    event: Annotated[Preemption | None, Field(serialization_alias="trigger")] = None
    depleted: tuple[Key, ...] = field(default_factory=tuple)
    best_effort: str | None = None  # why no plan met the time limit: this one finishes soonest within the budget
    # what the models it solved with assumed: the online calibration's factors over the prior profile
    assumed: str | None = None

    @model_serializer(mode="wrap")
    def _assumed_when_corrected(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``assumed`` is written only when the re-plan solved with corrected models."""
        return without_unset(handler(self), "assumed")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def old_config(self) -> str:
        return self.old_plan.config if self.old_plan is not None else ""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def new_config(self) -> str:
        return self.new_plan.config

    @field_serializer("problem")
    def _what_changed(self, problem: TrainingProblem) -> dict[str, Any]:
        return problem.model_dump(include={"iterations", "limits", "instances"}) | \
            {"launch_s": problem.overheads.launch_s}


def replan_changes(problem: TrainingProblem, *, remaining_iterations: int, elapsed_s: float, spent_usd: float,
                   depleted: set[Key], survivors: Mapping[Key, int], launch_s: float,
                   without_time_limit: bool = False) -> dict:
    """The fields of the re-plan problem (for ``model_copy(update=...)``);
    raises `ReplanInfeasible` when nothing is left to plan with.
    `without_time_limit`: the best effort, the least time within the budget."""
    if remaining_iterations < 1:
        raise ValueError(f"remaining_iterations is {remaining_iterations}: the job is done, nothing to re-plan")
    limits = problem.limits
    time_left = None if limits.time_s is None or without_time_limit else limits.time_s - elapsed_s
    cost_left = None if limits.cost_usd is None else limits.cost_usd - spent_usd
    if time_left is not None and time_left <= 0:
        raise ReplanInfeasible(f"the time limit {limits.time_s:g} s has passed ({elapsed_s:.1f} s elapsed)")
    if cost_left is not None and cost_left <= 0:
        raise ReplanInfeasible(f"the budget ${limits.cost_usd:g} is spent (${spent_usd:.4f})")
    instances = []
    for choice in problem.instances:
        key = (choice.instance_type, choice.market)
        quota = min(choice.quota, survivors.get(key, 0)) if key in depleted else choice.quota
        if quota > 0:
            instances.append(choice.model_copy(update={"quota": quota}))
    if not instances:
        gone = ", ".join(f"{t} ({m})" for t, m in sorted(depleted))
        raise ReplanInfeasible(f"no machine choice is left: depleted {gone}")
    return {
        "iterations": remaining_iterations,
        **({"objective": "min_time"} if without_time_limit else {}),
        "limits": Limits(time_s=time_left, cost_usd=cost_left),
        "instances": instances,
        "overheads": Overheads(launch_s=max(launch_s, problem.overheads.launch_s),
                               min_billed_s=problem.overheads.min_billed_s),
    }


class Corrections(Protocol):
    """The models a re-plan solves with (`calibration.OnlineCalibrator`)."""

    def space(self) -> TrainingSpace:
        """The problem's space with the corrected models."""

    def assumed(self) -> str:
        """What the corrected models assume, in words."""


class Replanner:
    """Re-solves a job as it runs, remembering the depleted markets; with
    `corrections`, with the models corrected online (said in ``assumed``)."""

    def __init__(self, problem: TrainingProblem, space: TrainingSpace | None = None, method: str = "auto",
                 time_limit_s: float | None = 1.0):
        self.problem = problem
        self.method, self.time_limit_s = method, time_limit_s
        self.corrections: Corrections | None = None
        self.depleted: set[Key] = set()
        self._space: TrainingSpace | None = space
        self._error: BaseException | None = None
        self._building: threading.Thread | None = None
        if space is None:  # loading models takes seconds: do it while the workers start
            self._building = threading.Thread(target=self._build, name="thrifty-replan-space", daemon=True)
            self._building.start()

    def _build(self) -> None:
        try:
            self._space = TrainingSpace(self.problem)
        except BaseException as e:  # noqa: BLE001 - raised where the space is needed
            self._error = e

    @property
    def space(self) -> TrainingSpace:
        if self._building is not None:
            self._building.join()
            self._building = None
        if self._error is not None:
            raise self._error
        assert self._space is not None  # given, or built by _build (which set _error otherwise)
        return self._space

    def deplete(self, key: Key) -> None:
        self.depleted.add(key)

    def replan(self, reason: str, *, old_plan: Plan | None, remaining_iterations: int, elapsed_s: float,
               spent_usd: float, survivors: Mapping[Key, int], launch_s: float, event_at: float,
               event: Preemption | None = None, best_effort: bool = False) -> Replan:
        """Solve the re-plan problem; `event_at` (unix seconds) is when the
        event that asked for it was seen. Raises `ReplanInfeasible` with the
        solver's reason when no plan meets what is left of the limits (with
        `best_effort`, when none meets what is left of the budget either)."""
        kwargs: dict = dict(old_plan=old_plan, remaining_iterations=remaining_iterations, elapsed_s=elapsed_s,
                            spent_usd=spent_usd, survivors=survivors, launch_s=launch_s, event_at=event_at,
                            event=event)
        try:
            return self._replan(reason, **kwargs)
        except ReplanInfeasible as e:
            if not best_effort or self.problem.limits.time_s is None:
                raise
            try:
                late = self._replan(reason, **kwargs, without_time_limit=True)
            except ReplanInfeasible:
                raise e from None
            return dataclasses.replace(late, best_effort=str(e))

    def forecast(self, *, remaining_iterations: int, elapsed_s: float, spent_usd: float,
                 survivors: Mapping[Key, int], launch_s: float) -> tuple[TrainingProblem, list[dict[str, Any]]] | None:
        """Whether any plan meets what is left with the models in force (the
        corrected ones): None when one does, or when the search could not
        prove that none does; else the re-plan problem and the least changes
        of its limits that admit a plan (`thrifty.solver.explain.limit_relaxations`,
        quick enough for a window; the full conflict analysis is not).
        Raises `ReplanInfeasible` when nothing is left to plan with."""
        from thrifty.solver.explain import limit_relaxations

        changes = replan_changes(self.problem, remaining_iterations=remaining_iterations, elapsed_s=elapsed_s,
                                 spent_usd=spent_usd, depleted=self.depleted, survivors=survivors, launch_s=launch_s)
        base = self.corrections.space() if self.corrections is not None else self.space
        space = base.derive(**changes)
        result = search_space(space, self.method, self.time_limit_s)
        if result.best is not None or not result.complete:
            return None
        return space.problem, limit_relaxations(space)

    def _replan(self, reason: str, *, old_plan: Plan | None, remaining_iterations: int, elapsed_s: float,
                spent_usd: float, survivors: Mapping[Key, int], launch_s: float, event_at: float,
                event: Preemption | None = None, without_time_limit: bool = False) -> Replan:
        start = time.perf_counter()
        changes = replan_changes(self.problem, remaining_iterations=remaining_iterations, elapsed_s=elapsed_s,
                                 spent_usd=spent_usd, depleted=self.depleted, survivors=survivors, launch_s=launch_s,
                                 without_time_limit=without_time_limit)
        base = self.corrections.space() if self.corrections is not None else self.space
        assumed = self.corrections.assumed() if self.corrections is not None else None
        space = base.derive(**changes)
        plan = solve(space.problem, method=self.method, time_limit_s=self.time_limit_s, space=space)
        solve_s = time.perf_counter() - start
        if not plan.feasible:
            why = plan.infeasibility.reason if plan.infeasibility else plan.status
            said = f"; the models assumed {assumed}" if assumed else ""
            raise ReplanInfeasible(f"no plan meets what is left after the {reason} ({remaining_iterations} "
                                   f"iterations, {_limits_text(space.problem.limits)}): {why}{said}", plan=plan)
        return Replan(reason, old_plan, plan, space.problem, time.time() - event_at, solve_s, event,
                      tuple(sorted(self.depleted)), assumed=assumed)


class ReplanPolicy:
    """When a running job re-plans (see the module docstring); the driver
    carries out what it says. `window_s` is the progress monitor's window,
    the unit of the slowdown hold-off."""

    def __init__(self, window_s: float, on_slowdown: bool = True):
        self.window_s, self.on_slowdown = window_s, on_slowdown
        self.fruitless = 0  # slowdown re-plans in a row that changed nothing (kept or infeasible)

    @staticmethod
    def graceful(events: Sequence[Interruption]) -> bool:
        """Every machine going has time left: the workers checkpoint and stop."""
        return all(isinstance(e, Notice) for e in events)

    @staticmethod
    def restart(graceful: bool, reached: int, last_checkpoint: int | None, start: int) -> int:
        """The iteration the next world starts from, so the re-plan is for the
        iterations after it: with time left, at least the one reached (the
        plan is for at most what is left); without, the last checkpoint (or
        where this world started)."""
        if graceful:
            return reached
        return last_checkpoint if last_checkpoint is not None else start

    @staticmethod
    def best_effort(reason: str) -> bool:
        """Machines lost (a preemption, no capacity): go on late rather than stop
        half done; a slowdown without a plan goes on as planned, and a
        calibration window's forecast asks whether any plan meets the limits."""
        return reason not in ("slowdown", "forecast")

    def on_slowdown_verdict(self, replan_asked: bool) -> bool:
        """Re-plan on the monitor's slowdown verdict?"""
        return replan_asked and self.on_slowdown

    def switch_on_slowdown(self, replan: Replan | None, config: str) -> bool:
        """Switch to a slowdown re-plan (None: none met the limits) from the
        plan of `config`? Only to a different configuration: switching to the
        same machines would only cost. One that changes nothing counts toward
        the hold-off (`hold_off_s`)."""
        if replan is None or replan.new_config == config:
            self.fruitless += 1
            return False
        self.fruitless = 0
        return True

    def hold_off_s(self) -> float:
        """How long the monitor waits before it judges a slowdown again after
        re-plans that changed nothing."""
        return slowdown_hold_off_s(self.window_s, self.fruitless)


def _limits_text(limits: Limits) -> str:
    parts = []
    if limits.time_s is not None:
        parts.append(f"{limits.time_s:.1f} s left")
    if limits.cost_usd is not None:
        parts.append(f"${limits.cost_usd:.4f} left")
    return ", ".join(parts) or "no limits"
