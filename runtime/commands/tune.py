"""``thrifty tune EXPERIMENT``: a hyperparameter tuning job from one file
(`thrifty.runtime.tuning.driver`), with the plan or the scheduler's settings
and the predicted time and cost before it starts, a live table of trials
while it runs (state, atoms, iteration, metric, best so far, time and cost
against the goal), and its results on disk.

Ctrl-C (SIGINT) and SIGTERM are handled alike: the running trials finish
their iteration and are checkpointed (a second signal stops them at once),
the state and ``summary.json`` are saved and one line gives the command that
goes on (``thrifty tune --resume DIR``); what the run was started with
(the cluster, the plot) is kept in DIR, so ``--resume DIR`` alone restores
it, and options given again override it. Resuming a run that finished says
so and changes nothing.

Exit codes: 0 done (and the target, when there is one, reached within the
budget; or a resumed run that had finished); 2 bad input, naming the field;
3 the goal is infeasible (the planner proved that no stage plan meets the
deadline within the budget); 4 the run ended without reaching its target or
within its budget; 1 a failure; 130 interrupted (SIGINT), 143 terminated
(SIGTERM): ``--resume DIR`` goes on from where it stopped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from thrifty.runtime.cli import EXIT_FAILURE, EXIT_INFEASIBLE, EXIT_OK, EXIT_OUTSIDE_LIMITS
from thrifty.runtime.commands._args import metrics_kinds, output_file, output_folder, with_exit_codes

HELP = "run a hyperparameter tuning experiment from one file (a scheduler or a RubberBand plan), results on disk"

EXIT_DETAILS = {
    0: "the target reached (if one was given) within the budget, or a resumed run that had finished",
    1: "",
    3: "no stage plan meets the deadline within the budget",
    4: "ended without reaching the target, or over the budget",
    143: "handled as Ctrl-C",
}
AFTER_CODES = ("After 130 or 143 the state is saved: go on with `thrifty tune --resume DIR`.\n"
               "The experiment file's fields: `thrifty schema experiment`.")

EXIT_STOPPED = {"interrupted": 130, "terminated": 143}  # 128 + the signal's number

REFRESH_S = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, EXIT_DETAILS, AFTER_CODES)
    parser.add_argument("experiment", metavar="EXPERIMENT", nargs="?",
                        help="the experiment file (JSON or YAML); not needed with --resume DIR")
    parser.add_argument("--cluster", default=None, metavar="CLUSTER",
                        help="where trials run, instead of the file's `cluster`: local (default), auto, "
                             "ray://HOST:PORT or a cluster config YAML (as thrifty run --cluster)")
    parser.add_argument("--storage", default=None, metavar="LOCATION",
                        help="where the trials checkpoint, instead of the file's `storage`: a folder, or "
                             "s3://BUCKET/PREFIX that every machine reaches, so a trial paused on one machine "
                             "resumes on another without a shared file system (default DIR/trials; the run keeps "
                             "its trials under LOCATION/NAME-TIME/)")
    parser.add_argument("--metrics", type=metrics_kinds, default=None, metavar="tensorboard,mlflow",
                        help="also write every result as TensorBoard event files (DIR/tensorboard, a run per "
                             "trial) and/or to MLflow's file store (DIR/mlruns); the 'tensorboard' and 'mlflow' "
                             "extras (DIR/metrics.jsonl is always written)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan or the scheduler's settings with the predicted time and cost, and stop")
    parser.add_argument("--out", type=output_folder, metavar="DIR",
                        help="the results folder (default thrifty-runs/NAME-TIME)")
    parser.add_argument("--resume", nargs="?", const=True, default=None, metavar="DIR",
                        help="go on with the stopped, killed or crashed run in DIR (default: the --out folder, "
                             "else the newest tuning run under thrifty-runs/), with what it was started with "
                             "(cluster, plot) unless given again")
    parser.add_argument("--plot", type=output_file, metavar="FILE.png",
                        help="where the plot goes (default DIR/tuning.png)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no live table: one plain line per trial launched, paused, ended or failed")
    parser.add_argument("--json", action="store_true",
                        help="print the summary as JSON at the end (implies --no-progress, without its lines)")


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
            lines.append(f"  stage {k}: {s.trials} trials x {s.iters_per_trial} iterations on "
                         f"{s.instances} x {s.instance_type}, {s.gpus_per_trial} per trial")
        from thrifty.solver.plan import provenance_lines

        said = provenance_lines(shown.plan.provenance)
        if said:
            lines.append("where the figures came from:")
            lines += [f"  {line}" for line in said]
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
        order = sorted(trials, key=lambda tr: (tr.state.value != "running", -(max(tr.metrics) if tr.metrics
                                                                              else -1e300), tr.trial_id))
        rows = [[str(tr.trial_id), tr.state.value, str(tr.atoms or ""), str(tr.iteration),
                 _fmt(e.value(tr.metrics[-1])) if tr.metrics else "-",
                 _fmt(e.value(max(tr.metrics))) if tr.metrics else "-"] for tr in order[:20]]
        cells = {k: [_cell(tr.config.get(k)) for tr in order[:20]] for k in keys}
        fixed = ["trial", "state", "atoms", "iter", e.metric, "best"]
        shown, left_out = fitting_columns(fixed, rows, cells, self.console.width)
        for name in fixed + shown:
            # a header is never cut: each column is at least as wide as its name
            table.add_column(name, justify="left" if name in ("state", *keys) else "right", min_width=len(name),
                             no_wrap=True)
        for i, row in enumerate(rows):
            table.add_row(*row, *(cells[k][i] for k in shown))
        notes = [f"{len(order) - 20} more trials"] if len(order) > 20 else []
        if left_out:
            notes.append(f"not shown (too wide for the terminal): {', '.join(left_out)}; every trial's "
                         "configuration is in summary.json")
        table.caption = "; ".join(notes) or None
        return table


def _cell(value: Any) -> str:
    return _fmt(value) if isinstance(value, float) else str(value)


def fitting_columns(fixed: list[str], rows: list[list[str]], cells: dict[str, list[str]],
                    width: int) -> tuple[list[str], list[str]]:
    """Which hyperparameter columns (`cells`: name -> its cells) fit beside the `fixed` ones in `width`
    characters, each column as wide as its name and its widest cell (rich's borders and padding: 3 a
    column, and 1); in order, the ones that do not fit left out (their names in the caption)."""

    def need(name: str, column: list[str]) -> int:
        return max([len(name), *map(len, column)]) + 3

    used = 1 + sum(need(name, [row[i] for row in rows]) for i, name in enumerate(fixed))
    shown, left_out = [], []
    for name, column in cells.items():
        if used + need(name, column) <= width:
            shown.append(name)
            used += need(name, column)
        else:
            left_out.append(name)
    return shown, left_out


def _infeasible(console: Any, err: Any) -> int:
    """The planner's proof, in the words `thrifty solve` uses for it."""
    from thrifty.runtime.commands.solve import infeasibility_lines

    console.print(f"thrifty tune: infeasible: {err}")
    why = getattr(err.plan, "infeasibility", None)
    for line in infeasibility_lines(why) if why is not None else []:
        console.print(line)
    return EXIT_INFEASIBLE


def _resume_folder(args: argparse.Namespace) -> str | None:
    """The folder of the run to go on with: ``--resume DIR``, else the ``--out`` folder, else the newest
    tuning run under ``thrifty-runs/`` (said on stderr); None without --resume."""
    from thrifty.core.errors import ProblemError
    from thrifty.runtime.tuning.driver import RUNS, newest_run

    if args.resume is None:
        return None
    if isinstance(args.resume, str):
        return args.resume
    if args.out is not None:
        return str(args.out)
    newest = newest_run()
    if newest is None:
        raise ProblemError(f"no tuning run under {RUNS}/ to resume: give --resume DIR", path="resume")
    print(f"thrifty tune: resuming {newest}", file=sys.stderr)
    return str(newest)


def _resume_command(args: argparse.Namespace, folder: Any) -> str:
    """The command that goes on with the run in `folder`: what the folder keeps (the experiment, the
    cluster, the plot) is not repeated; the output options are."""
    import shlex

    return " ".join(["thrifty tune --resume", shlex.quote(str(folder))]
                    + (["--no-progress"] if args.no_progress and not args.json else [])
                    + (["--json"] if args.json else []))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from thrifty.core.errors import ProblemError
    from thrifty.runtime.tuning.driver import (EXPERIMENT_COPY, GoalInfeasible, check_startable, finished_run,
                                               stored_options, tune, with_storage)
    from thrifty.runtime.tuning.experiment_file import load_experiment

    resume = _resume_folder(args)
    if args.experiment is None and resume is None:
        raise ProblemError("give an experiment file, or --resume DIR", path="experiment")
    console = Console(stderr=True)
    source = args.experiment or f"{resume}/{EXPERIMENT_COPY}"
    e = with_storage(load_experiment(source), args.storage, resume)
    if resume is not None:
        kept = stored_options(resume)  # what the run was started with, unless given again
        args.cluster = args.cluster or kept.get("cluster")
        args.plot = args.plot if args.plot is not None else kept.get("plot")
        done = finished_run(resume)
        if done is not None:
            print(f"thrifty tune: the run in {resume} finished ({done.get('end_reason')}) and has nothing to "
                  f"resume; its results: {resume}/summary.json", file=sys.stderr)
            return EXIT_OK
    if args.dry_run:  # every check the run makes before it starts (all problems at once), and nothing else
        try:
            shown = check_startable(e, args.cluster or e.cluster, source)
        except GoalInfeasible as err:
            return _infeasible(console, err)
        print(_preview_text(shown, e))
        return EXIT_OK
    live: LiveTable | None = None

    def on_start(shown: Any, executor: Any) -> None:
        nonlocal live
        console.print(_preview_text(shown, e))
        if not (args.json or args.no_progress):
            live = LiveTable(e, console)
            live.start(executor)

    def on_event(event: dict[str, Any]) -> None:
        if live is not None:
            live.event(event)
        elif args.no_progress and not args.json:
            line = _event_line(event, e)
            if line:
                print(line, file=sys.stderr, flush=True)

    def on_stop(reason: str) -> None:
        console.print(f"thrifty tune: {reason}: stopping; the running trials finish their iteration and are "
                      "checkpointed (Ctrl-C again stops them at once)", markup=False, highlight=False)

    try:
        result = tune(e, out=args.out if resume is None else None, resume=resume, cluster=args.cluster,
                      storage=args.storage, plot=args.plot, metrics=args.metrics, on_start=on_start,
                      on_event=on_event, on_stop=on_stop, source=source)
    except GoalInfeasible as err:
        return _infeasible(console, err)
    finally:
        if live is not None and live.live.is_started:
            live.stop()
    for note in result.notes:
        print(f"thrifty tune: resumed: {note}", file=sys.stderr)
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
        for line in result.metrics:
            print(line)
    if result.stopped:
        print(f"thrifty tune: {result.end_reason}; resume with: {_resume_command(args, result.out)}",
              file=sys.stderr)
        return EXIT_STOPPED[result.end_reason]
    if result.trials and all(t.error for t in result.trials):
        print("every trial failed; see the worker logs under " + str(result.out / "trials"), file=sys.stderr)
        return EXIT_FAILURE
    if not result.goal_met:
        print(f"the goal was not met: {result.goal_missed}", file=sys.stderr)
        return EXIT_OUTSIDE_LIMITS
    return EXIT_OK


def _event_line(event: dict[str, Any], e: Any) -> str | None:
    """One plain line for a trial's launch, pause, end or failure (``--no-progress``); none for a result."""
    kind, trial, t = event.get("event"), event.get("trial"), float(event.get("t", 0.0))
    if kind == "launch":
        start = f"from iteration {event['from_iteration']}" if event.get("from_iteration") else "new"
        return f"{t:8.1f} s  trial {trial} started ({start}) on {event.get('atoms')} atoms"
    if kind == "suspend":
        why = " (the run stops; it goes on from there when resumed)" if event.get("interrupted") else ""
        return f"{t:8.1f} s  trial {trial} paused at iteration {event.get('iteration')}{why}"
    if kind == "terminate":
        if event.get("interrupted"):
            return (f"{t:8.1f} s  trial {trial} stopped at iteration {event.get('iteration')} (it goes on from its "
                    "last checkpoint when resumed)")
        return f"{t:8.1f} s  trial {trial} ended at iteration {event.get('iteration')}"
    if kind == "crash":
        return f"{t:8.1f} s  trial {trial} failed: {event.get('message')}"
    return None
