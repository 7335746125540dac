"""What a tuning run keeps on disk, written as it happens, and how a killed
run is read back to go on from (``thrifty tune --out DIR`` / ``--resume DIR``).

`RecordingExecutor` wraps any executor (the local one, the Ray one, the
simulated one) and appends one JSON line per thing that happens to
``DIR/events.jsonl``, flushed at once, so a driver killed at any moment
leaves every event before the kill:

- ``launch``: a trial starts or resumes (``config`` on its first launch,
  ``atoms``, ``from_iteration``, the machines ``where`` a plan placed it);
- ``result``: one iteration's metric (in the metric's own units),
  ``iteration_s``, ``atoms``, ``overhead_s``, and the ``checkpoint`` of
  the iteration when the executor wrote one before reporting it (the local
  executor's durable iterations; ``"recovered": true`` on a result a resumed
  run found in the checkpoint of a trial whose driver was killed before it
  heard it: `unheard_results`);
- ``crash``: the trial's processes died or its code raised;
- ``suspend``: a checkpoint was written (a pause, the first half of a
  resize, or a completed trial's final checkpoint), with its reference;
- ``terminate``: the trial was stopped.

A suspend or stop that the end of the run made (Ctrl-C, SIGTERM, a crash of
the driver: the trial was running and its scheduler did not ask for it)
carries ``"interrupted": true``.

Every line carries ``t``, seconds since the experiment started (runs
resumed from the same folder continue the count). The same wrapper serves
the tuning loop and the RubberBand plan executor, which call the executor
interface alike.

`read_history` turns the lines back into trials (`Resumed`): a trial whose
last word was ``terminate`` or ``crash`` is finished (completed when it
reached ``max_iterations``); one last ``suspend``-ed is paused at its
checkpoint; one still running when the run ended (the driver was killed, or
its last suspend or stop is ``interrupted``) goes back to its last checkpoint
(a suspend's, or its last checkpointed result's: with durable iterations,
its last result) if it has one (results after it are dropped, and listed in
`Resumed.dropped`), else starts again, and is launched again first, on the
atoms it held (the loop first settles its last result: `Experiment`). With the trials come the steps
the run's scheduler heard (launches, results, its pauses and the trials'
ends, in the order they happened), which the loop replays to rebuild it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty.core.errors import ProblemError
from thrifty.core.io import JsonLinesLog as EventLog
from thrifty.runtime.tuning.executors.plan import record_result
from thrifty.runtime.tuning.loop import Executor, ReplayStep, Resumed
from thrifty.runtime.tuning.trial import ENDED, Crash, Report, Trial, TrialState

__all__ = ["EventLog", "RecordingExecutor", "read_events", "read_history", "unheard_results", "EVENTS"]

EVENTS = "events.jsonl"


def read_events(path: str | Path) -> list[dict[str, Any]]:
    """The events of a log; a last line cut short by a kill is left out."""
    events = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines) - 1:  # not the (possibly cut) last line
                raise ProblemError(f"line {number} is not JSON", source=str(path)) from None
    return events


class RecordingExecutor:
    """`inner`, with every call it gets and every event it gives written to
    `log` (see the module docstring). `value(score)` turns a score back into
    the metric's units; `t0` is the clock time of the experiment's start;
    `on_event(event)` is called after each line (a live table redraws)."""

    def __init__(self, inner: Executor, log: EventLog, *, t0: float, value: Callable[[float], float] = float,
                 on_event: Callable[[dict[str, Any]], None] | None = None):
        self.inner = inner
        self.clock = inner.clock
        self.log = log
        self.t0 = t0
        self.value = value
        self.on_event = on_event
        self.trials: dict[int, Trial] = {}

    def _write(self, event: dict[str, Any]) -> None:
        event = {"t": round(self.clock.now() - self.t0, 6), **event}
        self.log.write(event)
        if self.on_event is not None:
            self.on_event(event)

    def launch(self, trial: Trial, atoms: int, where: Mapping[str, int] | None = None) -> None:
        event: dict[str, Any] = {"event": "launch", "trial": trial.trial_id, "atoms": atoms,
                                 "from_iteration": trial.iteration}
        if trial.trial_id not in self.trials or trial.iteration == 0:
            event["config"] = trial.config
        if where:
            event["where"] = dict(where)
        self.trials[trial.trial_id] = trial
        self._write(event)
        self.inner.launch(trial, atoms, where)

    def proceed(self, trial: Trial) -> None:
        self.inner.proceed(trial)

    def suspend(self, trial: Trial) -> Any:
        checkpoint = self.inner.suspend(trial)
        self._write({"event": "suspend", "trial": trial.trial_id, "iteration": trial.iteration,
                     "checkpoint": checkpoint, **_interrupted(trial)})
        return checkpoint

    def terminate(self, trial: Trial) -> None:
        self.inner.terminate(trial)
        self._write({"event": "terminate", "trial": trial.trial_id, "iteration": trial.iteration,
                     **_interrupted(trial)})

    def next_event(self, until: float | None) -> Report | Crash | None:
        event = self.inner.next_event(until)
        if isinstance(event, Report):
            metric = event.metric
            shown = self.value(metric) if isinstance(metric, (int, float)) and math.isfinite(metric) else metric
            line = {"event": "result", "trial": event.trial_id, "iteration": event.iteration,
                    "metric": shown, "iteration_s": event.iteration_s, "atoms": event.atoms,
                    "overhead_s": event.overhead_s, "at": event.at - self.t0}
            self._write(line if event.checkpoint is None else {**line, "checkpoint": event.checkpoint})
        elif isinstance(event, Crash):
            self._write({"event": "crash", "trial": event.trial_id, "message": event.message})
        return event

    def note(self, event: dict[str, Any]) -> None:
        """A line about something other than a trial (the plan executor's machines: ``provision``,
        ``release``)."""
        self._write(dict(event))

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


def _interrupted(trial: Trial) -> dict[str, bool]:
    """The mark of a suspend or stop that the run's end made, not the trial's scheduler."""
    return {"interrupted": True} if trial.interrupted else {}


@dataclass
class _Replay:
    config: dict[str, Any]
    created_at: float
    results: list[dict[str, Any]] = field(default_factory=list)
    launches: list[dict[str, Any]] = field(default_factory=list)
    steps: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (line number, event) since its start
    checkpoint: Any = None
    checkpoint_iteration: int = 0
    last: str = "launch"
    interrupted: bool = False
    error: str | None = None
    ended_at: float | None = None


def _replays(events: list[dict[str, Any]]) -> Iterator[tuple[int, _Replay]]:
    trials: dict[int, _Replay] = {}
    for line, e in enumerate(events):
        kind, tid = e.get("event"), e.get("trial")
        if not isinstance(tid, int):
            continue
        if kind == "launch":
            if tid not in trials:
                trials[tid] = _Replay(dict(e.get("config") or {}), float(e["t"]))
            r = trials[tid]
            if int(e.get("from_iteration", 0)) == 0:  # a fresh start: nothing before it counts
                r.results, r.launches, r.steps, r.checkpoint, r.checkpoint_iteration = [], [], [], None, 0
            r.launches.append(e)
            r.steps.append((line, e))
            r.last, r.ended_at, r.interrupted = "launch", None, False
            continue
        r = trials[tid]
        r.steps.append((line, e))
        if kind == "result":
            r.results.append(e)
            if isinstance(e.get("checkpoint"), dict):  # a durable iteration
                r.checkpoint, r.checkpoint_iteration = e["checkpoint"], int(e["iteration"])
            metric = e.get("metric")
            if not (isinstance(metric, (int, float)) and math.isfinite(metric)):
                r.last, r.error = "crash", f"reported metric {metric!r} at iteration {e.get('iteration')}"
                r.ended_at = float(e["t"])
        elif kind == "crash":
            r.last, r.error, r.ended_at = "crash", str(e.get("message")), float(e["t"])
        elif kind == "suspend":
            checkpoint = e.get("checkpoint")
            if not (isinstance(checkpoint, dict) and checkpoint.get("error")):
                r.checkpoint, r.checkpoint_iteration = checkpoint, int(e.get("iteration", len(r.results)))
            r.last, r.ended_at, r.interrupted = "suspend", float(e["t"]), bool(e.get("interrupted"))
        elif kind == "terminate" and r.last != "crash":
            if e.get("interrupted"):  # stopped by the run's end without a checkpoint: as if the driver died
                r.last, r.ended_at = "launch", None
            else:
                r.last, r.ended_at = "terminate", float(e["t"])
    yield from sorted(trials.items())


def read_history(events: list[dict[str, Any]], max_iterations: int,
                 score: Callable[[float], float] = float) -> Resumed:
    """The trials of a recorded run, their kept results and the steps to
    replay, to resume from (see the module docstring); `score(metric)` turns
    the recorded metric back into what the schedulers see.

    A trial still running when the run ended (its last word a launch: the
    driver was killed; or a suspend or stop marked ``interrupted``: the
    driver was interrupted or crashed) is `interrupted`, back to its last
    checkpoint (paused) or, without one, to the start (pending), and listed
    in `Resumed.running` with the atoms it held, to be launched again first."""
    trials: list[Trial] = []
    kept: list[tuple[float, int, Report]] = []
    steps: list[tuple[int, ReplayStep]] = []
    running: dict[int, int] = {}
    dropped: dict[int, tuple[int, int]] = {}
    for expected, (tid, r) in enumerate(_replays(events)):
        if tid != expected:
            raise ProblemError(f"the event log has no launch of trial {expected} (it has trial {tid})",
                               path=EVENTS)
        trial = Trial(trial_id=tid, config=r.config, created_at=r.created_at)
        results = r.results
        if r.last == "launch" or (r.last == "suspend" and r.interrupted):  # running when the run ended
            results = results[:r.checkpoint_iteration] if r.checkpoint is not None else []
            if len(results) < len(r.results):
                dropped[tid] = (len(results) + 1, len(r.results))
            trial.state = TrialState.PAUSED if r.checkpoint is not None else TrialState.PENDING
            trial.interrupted = True
            running[tid] = int(r.launches[-1].get("atoms", 1)) if r.launches else 1
        elif r.last == "suspend":
            done = len(results) >= max_iterations
            trial.state = TrialState.COMPLETED if done else TrialState.PAUSED
            if r.checkpoint is None and not done:  # its checkpoint failed: start again
                trial.state, results = TrialState.PENDING, []
        elif r.last == "crash":
            trial.state, trial.error = TrialState.FAILED, r.error
        else:
            trial.state = TrialState.COMPLETED if len(results) >= max_iterations else TrialState.TERMINATED
        if trial.state in ENDED:
            trial.ended_at = r.ended_at
        trial.checkpoint = r.checkpoint if trial.state != TrialState.PENDING else None
        _fill(trial, results, r.launches, score)
        trials.append(trial)
        kept += [(float(e["t"]), i, _report(tid, e, score)) for i, e in enumerate(results)
                 if trial.state != TrialState.FAILED or _finite(e.get("metric"))]
        if trial.state != TrialState.PENDING:
            steps += _steps(trial, r, len(results), max_iterations, score)
    elapsed = max((float(e["t"]) for e in events if "t" in e), default=0.0)
    kept.sort(key=lambda x: (x[0], x[2].trial_id, x[1]))
    steps.sort(key=lambda x: x[0])
    return Resumed(trials, [report for _, _, report in kept], elapsed, steps=[step for _, step in steps],
                   running=running, dropped=dropped)


def unheard_results(events: list[dict[str, Any]], find: Callable[[int, int], dict[str, Any] | None],
                    value: Callable[[float], float] = float) -> list[dict[str, Any]]:
    """Result lines for the iterations that trials running when a run was
    killed had checkpointed, with their result, but the driver had not heard
    (it was killed between the checkpoint and the result): `find(trial,
    iteration)` is the executor's reader of a trial's checkpoint
    (`executor_local.checkpointed_result`), giving the next iteration's
    result or None (its metric as the executor reports it; `value` turns it
    into the metric's units, as `RecordingExecutor` writes it). Each line is
    dated at the log's last time, marked ``recovered``; append them to the
    log before `read_history`."""
    last_t = max((float(e["t"]) for e in events if "t" in e), default=0.0)
    out = []
    for tid, r in _replays(events):
        if r.last != "launch":  # ended, paused, or suspended by a graceful stop: its checkpoint is its last result
            continue
        since = len(r.results)
        if since and r.checkpoint_iteration != since:  # its last result was not durable: nothing newer is
            continue
        found = find(tid, since)
        if found is None:
            continue
        atoms = int(r.launches[-1].get("atoms", 1)) if r.launches else 1
        out.append({"t": last_t, "event": "result", "trial": tid, "iteration": int(found["iteration"]),
                    "metric": value(found["metric"]), "iteration_s": found["iteration_s"], "atoms": atoms,
                    "overhead_s": 0.0, "at": last_t, "checkpoint": found["checkpoint"], "recovered": True})
    return out


def _steps(trial: Trial, r: _Replay, kept: int, max_iterations: int,
           score: Callable[[float], float]) -> list[tuple[int, ReplayStep]]:
    """What the scheduler of the run heard of `trial`, up to its `kept` results: its launches, its
    finite results, the pauses its scheduler asked for, and its end (a run's own stop, marked
    ``interrupted``, is no decision of the scheduler's and is left out)."""
    tid, out = trial.trial_id, []
    for line, e in r.steps:
        kind, t = e.get("event"), float(e["t"])
        if kind == "launch" and int(e.get("from_iteration", 0)) <= kept:
            out.append((line, ReplayStep("launch", tid, t, atoms=int(e.get("atoms", 1)))))
        elif kind == "result" and int(e["iteration"]) <= kept and _finite(e.get("metric")):
            report = _report(tid, e, score)
            out.append((line, ReplayStep("result", tid, report.at, atoms=report.atoms, report=report)))
        elif kind == "suspend" and not e.get("interrupted") and int(e.get("iteration", 0)) <= kept:
            completed = int(e.get("iteration", 0)) >= max_iterations
            out.append((line, ReplayStep("end" if completed else "pause", tid, t,
                                         state=TrialState.COMPLETED if completed else TrialState.PAUSED)))
    if trial.state in ENDED:
        last = r.steps[-1][0] if r.steps else 0
        if not out or out[-1][1].kind != "end":
            out.append((last, ReplayStep("end", tid, r.ended_at or 0.0, state=trial.state)))
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _report(tid: int, e: dict[str, Any], score: Callable[[float], float]) -> Report:
    return Report(tid, int(e["iteration"]), score(float(e["metric"])), float(e["iteration_s"]), int(e["atoms"]),
                  float(e.get("at", e["t"])), float(e.get("overhead_s", 0.0)))


def _fill(trial: Trial, results: list[dict[str, Any]], launches: list[dict[str, Any]],
          score: Callable[[float], float]) -> None:
    """A trial's history from its kept results (finite ones: a NaN failed it),
    recorded as the loop records them (`record_result`: the first result after
    each launch carries that launch's start-up time)."""
    trial.launches = len(launches)
    first_after_launch = {int(launch.get("from_iteration", 0)) + 1 for launch in launches}
    for e in results:
        if not _finite(e.get("metric")):
            continue
        report = _report(trial.trial_id, e, score)
        if report.iteration in first_after_launch:
            trial.iterations_since_launch = 0
        record_result(trial, report)
    trial.resizes = sum(1 for a, b in zip(launches, launches[1:])
                        if int(b.get("from_iteration", 0)) > 0 and a.get("atoms") != b.get("atoms"))
