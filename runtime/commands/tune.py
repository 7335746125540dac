"""``thrifty tune EXPERIMENT``: a hyperparameter tuning job from one file
(`thrifty.runtime.tuning.driver`), with the plan or the scheduler's settings
and the predicted time and cost before it starts, a live table of trials
while it runs (state, atoms, iteration, metric, best so far, time and cost
against the goal), and its results on disk.

Exit codes: 0 done (and the target, when there is one, reached within the
budget); 2 bad input, naming the field; 3 the goal is infeasible (the
planner proved that no stage plan meets the deadline within the budget);
4 the run ended without reaching its target or within its budget; 1 a
failure; 130 interrupted (``--resume DIR`` goes on from where it stopped).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from thrifty.runtime.cli import EXIT_FAILURE, EXIT_INFEASIBLE, EXIT_OK, EXIT_OUTSIDE_LIMITS
from thrifty.runtime.commands._args import output_file, output_folder

HELP = "run a hyperparameter tuning experiment from one file (a scheduler or a RubberBand plan), results on disk"

EPILOG = """exit codes: 0 done (the target reached, if one was given, within the budget); 2 bad input;
3 the goal is infeasible (no stage plan meets the deadline within the budget); 4 ended without
reaching the target or over the budget; 1 a failure; 130 interrupted (go on with --resume DIR).
The experiment file's fields: `thrifty schema experiment`."""

REFRESH_S = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("experiment", metavar="EXPERIMENT", nargs="?",
                        help="the experiment file (JSON or YAML); not needed with --resume DIR")
    parser.add_argument("--cluster", default=None, metavar="CLUSTER",
                        help="where trials run, instead of the file's `cluster`: local (default), auto, "
                             "ray://HOST:PORT or a cluster config YAML (as thrifty run --cluster)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan or the scheduler's settings with the predicted time and cost, and stop")
    parser.add_argument("--out", type=output_folder, metavar="DIR",
                        help="the results folder (default thrifty-tune/NAME-TIME)")
    parser.add_argument("--resume", metavar="DIR", help="go on with the killed or interrupted run in DIR")
    parser.add_argument("--plot", type=output_file, metavar="FILE.png",
                        help="where the plot goes (default DIR/tuning.png)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON at the end (no live table)")


def _fmt(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _preview_text(shown: Any, e: Any) -> str:
    lines = [f"experiment {e.name or '(unnamed)'}: {e.samples} configurations of {e.trainer}, "
             f"{e.metric} ({e.mode}), up to {e.max_iterations} iterations each, on {shown.where}"]
    settings = ", ".join(f"{k}={v}" for k, v in shown.settings.items() if v is not None)
    lines.append(f"scheduler {shown.scheduler}" + (f" ({settings})" if settings else "")
                 + (f" on {shown.atoms} atoms" if shown.atoms else ""))
    goal = [f"deadline {e.deadline_s:g} s" if e.deadline_s is not None else None,
            f"target {e.metric} {e.target:g}" if e.target is not None else None,
            f"budget ${e.budget_usd:g}" if e.budget_usd is not None else None]
    lines.append("goal: " + (", ".join(g for g in goal if g) or "none (every configuration to the end)"))
    if shown.plan is not None:
        lines.append("plan (RubberBand stages, the least cost that meets the deadline):")
        for k, s in enumerate(shown.plan.stages):
            lines.append(f"  stage {k}: {s['trials']} trials x {s['iters_per_trial']} iterations on "
                         f"{s['instances']} x {s['instance_type']}, {s['gpus_per_trial']} per trial")
    if shown.predicted_s is not None:
        what = "predicted" if shown.plan is not None else "at most (the time limit)"
        cost = f", ${shown.predicted_usd:.4f}" if shown.predicted_usd is not None else ""
        lines.append(f"{what}: {shown.predicted_s:.1f} s{cost}")
    return "\n".join(lines)


class LiveTable:
    """The rich table of trials, redrawn at most every `REFRESH_S` while events arrive."""

    def __init__(self, e: Any, console: Any):
        from rich.live import Live

        self.e = e
        self.console = console
        self.started = time.monotonic()
        self.executor: Any = None
        self.live = Live(console=console, auto_refresh=False, transient=False)
        self._last = 0.0

    def start(self, executor: Any) -> None:
        self.executor = executor
        self.live.start()

    def event(self, event: dict[str, Any]) -> None:
        now = time.monotonic()
        if now - self._last >= REFRESH_S and self.executor is not None:
            self._last = now
            self.live.update(self.render(float(event.get("t", 0.0))), refresh=True)

    def stop(self, elapsed: float | None = None) -> None:
        if self.executor is not None:
            self.live.update(self.render(elapsed), refresh=True)
        self.live.stop()
        self.console.print()

    def render(self, elapsed: float | None) -> Any:
        from rich.table import Table

        e = self.e
        trials = list(self.executor.trials.values())
        keys = [k for k, v in e.search_space.items() if isinstance(v, dict)]
        best = max((max(t.metrics) for t in trials if t.metrics), default=None)
        t = elapsed if elapsed is not None else time.monotonic() - self.started
        goal = f"{t:.0f} s" + (f" of {e.deadline_s:g} s" if e.deadline_s else "")
        cost = e.usd(t) if e.scheduler.name != "plan" else None
        if cost is not None and e.resources.usd_per_atom_hour:
            goal += f", ${cost:.4f}" + (f" of ${e.budget_usd:g}" if e.budget_usd else "")
        shown_best = _fmt(e.value(best)) if best is not None else "-"
        table = Table(title=f"{e.name or 'tuning'} ({e.scheduler.name}): {goal}; best {e.metric} {shown_best}"
                      + (f" (target {e.target:g})" if e.target is not None else ""), title_justify="left")
        for name in ("trial", "state", "atoms", "iter", e.metric, "best", *keys):
            table.add_column(name, justify="right" if name not in ("state", *keys) else "left")
        order = sorted(trials, key=lambda tr: (tr.state.value != "running", -(max(tr.metrics) if tr.metrics
                                                                              else -1e300), tr.trial_id))
        for tr in order[:20]:
            last = _fmt(e.value(tr.metrics[-1])) if tr.metrics else "-"
            top = _fmt(e.value(max(tr.metrics))) if tr.metrics else "-"
            cells = [_fmt(tr.config.get(k)) if isinstance(tr.config.get(k), float) else str(tr.config.get(k))
                     for k in keys]
            table.add_row(str(tr.trial_id), tr.state.value, str(tr.atoms or ""), str(tr.iteration), last, top, *cells)
        if len(order) > 20:
            table.caption = f"{len(order) - 20} more trials"
        return table


def _infeasible(console: Any, err: Any) -> int:
    """The planner's proof, in the words `thrifty solve` uses for it."""
    from thrifty.runtime.commands.solve import infeasibility_lines

    console.print(f"thrifty tune: infeasible: {err}")
    why = getattr(err.plan, "infeasibility", None)
    for line in infeasibility_lines(why) if why is not None else []:
        console.print(line)
    return EXIT_INFEASIBLE


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from thrifty.datasets.errors import ProblemError
    from thrifty.runtime.tuning.driver import EXPERIMENT_COPY, GoalInfeasible, check_startable, tune
    from thrifty.runtime.tuning.experiment_file import load_experiment

    if args.experiment is None and args.resume is None:
        raise ProblemError("give an experiment file, or --resume DIR", path="experiment")
    console = Console(stderr=True)
    e = load_experiment(args.experiment or f"{args.resume}/{EXPERIMENT_COPY}")
    if args.dry_run:  # every check the run makes before it starts (all problems at once), and nothing else
        try:
            shown = check_startable(e, args.cluster or e.cluster)
        except GoalInfeasible as err:
            return _infeasible(console, err)
        print(_preview_text(shown, e))
        return EXIT_OK
    live: LiveTable | None = None

    def on_start(shown: Any, executor: Any) -> None:
        nonlocal live
        console.print(_preview_text(shown, e))
        if not args.json:
            live = LiveTable(e, console)
            live.start(executor)

    def on_event(event: dict[str, Any]) -> None:
        if live is not None:
            live.event(event)

    try:
        result = tune(e, out=args.out, resume=args.resume, cluster=args.cluster, plot=args.plot,
                      on_start=on_start, on_event=on_event)
    except GoalInfeasible as err:
        return _infeasible(console, err)
    finally:
        if live is not None and live.live.is_started:
            live.stop()
    summary = result.summary()
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        best = summary["best"]
        print(f"{summary['end_reason']} after {result.elapsed_s:.1f} s, ${result.cost_usd:.4f}; "
              f"{summary['results']} results from {len(result.trials)} trials")
        if best["trial"] is not None:
            print(f"best: trial {best['trial']}, {e.metric} {_fmt(best['metric'])}, config {best['config']}")
        print(f"results: {result.out} (summary.json, events.jsonl, best/)" +
              (f"; plot: {result.plot}" if result.plot else ""))
    if result.trials and all(t.error for t in result.trials):
        print("every trial failed; see the worker logs under " + str(result.out / "trials"), file=sys.stderr)
        return EXIT_FAILURE
    if not result.goal_met:
        print(f"the goal was not met: {result.goal_missed}", file=sys.stderr)
        return EXIT_OUTSIDE_LIMITS
    return EXIT_OK
