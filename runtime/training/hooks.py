"""Callbacks on what happens during a run: ``preemption``, ``slowdown``,
``replanned``, ``finished`` (the re-plan hooks of issue 5, Srifty 4.5),
``prediction_off``, ``calibrated`` and ``infeasible_forecast``.

::

    hooks = Hooks()

    @hooks.on("preemption")
    def tell(event):              # a thrifty.runtime.events.Preemption
        print("lost", event.instance_type, event.market, "via", event.source)

    hooks.on("replanned", lambda replan: print(replan.reason, replan.new_config))
    train(plan, trainer, problem=problem, hooks=hooks)

Payloads: ``preemption`` a `Preemption`; ``slowdown`` the monitor's
`Verdict`; ``replanned`` a `Replan` (reason, old and new plan, latency);
``finished`` the `RunResult`; ``prediction_off`` a `PredictionOff` (the
measured and predicted iteration time differ by more than 1.5x, once a run);
``calibrated`` the ``calibration`` event of the run log (a dict: a window's
prior, corrected and measured components and the factors,
`thrifty.runtime.training.calibration`); ``infeasible_forecast`` an
`InfeasibleForecast` (the corrected models leave no plan within the limits:
the least change that admits one). Callbacks run in the driver, in order of
registration; an exception in one stops the run (its workers are stopped and
the last checkpoint is kept), so a callback may end a run on purpose.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thrifty.core.errors import ProblemError, closest_names

__all__ = ["Hooks", "HOOK_EVENTS"]

HOOK_EVENTS = ("preemption", "slowdown", "replanned", "finished", "prediction_off", "calibrated",
               "infeasible_forecast")


class Hooks:
    def __init__(self) -> None:
        self._callbacks: dict[str, list[Callable[[Any], Any]]] = {name: [] for name in HOOK_EVENTS}

    def on(self, event: str, callback: Callable[[Any], Any] | None = None) -> Any:
        """Register `callback` for `event`; without a callback, a decorator."""
        if event not in self._callbacks:
            close = closest_names(event, HOOK_EVENTS)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ProblemError(f"hook event is '{event}', but must be one of {', '.join(HOOK_EVENTS)}{hint}")
        if callback is None:
            return lambda fn: self.on(event, fn)
        if not callable(callback):
            raise ProblemError(f"hook for '{event}' is a {type(callback).__name__}, but must be callable")
        self._callbacks[event].append(callback)
        return callback

    def emit(self, event: str, payload: Any) -> None:
        for callback in list(self._callbacks[event]):
            callback(payload)

    def count(self, event: str) -> int:
        return len(self._callbacks[event])
