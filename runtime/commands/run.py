"""``thrifty run``: carry out a training plan on machines from a provider, with a
live progress bar (predicted against actual), re-planning on preemption or a
certain slowdown (Srifty 4.5), a JSON-lines run log and a timeline at the end.

``thrifty run PLAN.json --problem PROBLEM.json --job MODULE:FUNCTION`` (a loop function, or a
`Trainer` factory; ``path/to/train.py:FUNCTION`` names one in a file; ``--trainer`` is the same;
without it, the problem's ``"job"``); a
problem file (JSON or YAML) in place of the plan is solved first.
``thrifty run --resume [RUN_DIR]`` continues a run from its checkpoint with
what its run record holds (plan, problem, trainer, settings, cluster, plot);
the time and money already spent count against the limits. Without RUN_DIR
it is ``--out``'s folder, else the run under ``./thrifty-runs/`` active last.
A finished run is not run again: it says so, with its result, and exits 0.

``--dry-run`` makes every check the run makes before it starts work
(`thrifty.runtime.training.preflight.check_run`, which `train` calls too),
prints every problem found, one a line, and exits 2, or prints what the run
would do; it starts nothing. Ctrl-C (SIGINT) and SIGTERM stop a run the same
way: the workers checkpoint and stop, and the resume command is printed.
After a run that started, however it ended, the timeline is printed and
``--plot`` drawn from what the run log holds.

Exit codes: 0 every iteration done within the limits; 4 every iteration done,
but past the time limit or the budget (what was exceeded is printed; a
preemption that leaves no plan within the time limit goes on late with the
soonest plan within the budget); 3 no plan meets the limits at the start, or
a preemption leaves no machine choice or no budget; 2 bad input; 1 a
failure; 130 interrupted (SIGINT); 143 terminated (SIGTERM). After 1, 3, 130
and 143 the run can be resumed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from thrifty.runtime.cli import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INFEASIBLE, EXIT_OK, EXIT_OUTSIDE_LIMITS
from thrifty.runtime.commands._args import int_at_least, metrics_kinds, non_negative_float, output_file, \
    positive_float, with_exit_codes

if TYPE_CHECKING:
    from types import TracebackType

    from rich.progress import Progress, TaskID

EXIT_INTERRUPTED, EXIT_TERMINATED = 128 + signal.SIGINT, 128 + signal.SIGTERM  # 130, 143

HELP = "run a training plan (local worker processes by default, or a Ray cluster), watch it and re-plan on preemption"

_FAULT_KEYS = {"kill": {"machine", "iteration", "time", "warning"}, "slow": {"machine", "from", "until", "extra"}}


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object, e.g. '{\"lr\": 0.1}'")
    return value


def parse_fault(text: str) -> Any:
    """``kill:machine=0,iteration=100[,warning=120]``, ``kill:machine=0,time=30``
    or ``slow:machine=1,from=100,extra=0.05[,until=200]``."""
    from thrifty.core.errors import ProblemError
    from thrifty.runtime.training.faults import KillWorker, SlowWorker

    kind, _, rest = text.partition(":")
    if kind not in _FAULT_KEYS:
        raise argparse.ArgumentTypeError(f"'{text}': a fault starts with 'kill:' or 'slow:'")
    fields: dict[str, float] = {}
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        if key not in _FAULT_KEYS[kind]:
            raise argparse.ArgumentTypeError(f"'{text}': unknown key '{key}'; {kind} takes "
                                             f"{', '.join(sorted(_FAULT_KEYS[kind]))}")
        try:
            fields[key] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}': {key}={value} is not a number") from None
    as_int = {k: int(v) for k, v in fields.items() if k in ("machine", "iteration", "from", "until")}
    try:
        if kind == "kill":
            return KillWorker(as_int.get("machine", 0), as_int.get("iteration"), fields.get("time"),
                              fields.get("warning"))
        return SlowWorker(as_int.get("machine", 0), as_int.get("from", 0), fields.get("extra", 0.0),
                          as_int.get("until"))
    except ProblemError as e:
        raise argparse.ArgumentTypeError(f"'{text}': {e}") from None


EXIT_DETAILS = {
    0: "every iteration done within the limits (or, with --resume, the run had finished; --dry-run: every check "
       "passed)",
    1: "a worker raised, a world did not form, a stall",
    2: "a plan that does not match its problem, machines its provider cannot give, a bad job, a fault the run "
       "cannot have, ... (all of them, one a line; --dry-run: every problem found)",
    3: "no plan meets the limits at the start, or a preemption leaves no machine or budget",
    4: "every iteration done, but past the time limit or the budget (printed with by how much; a preemption that "
       "leaves no plan within the time limit goes on late)",
    143: "handled as Ctrl-C",
}
RESUMING = "After 1, 3, 130 or 143 the last checkpoint is kept and `thrifty run --resume RUN_DIR` goes on from it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, EXIT_DETAILS, RESUMING)
    parser.add_argument("plan", metavar="PLAN.json", nargs="?",
                        help="a plan from `thrifty solve --out`, or a training problem (JSON or YAML) to solve "
                             "first; not needed with --resume RUN_DIR")
    parser.add_argument("--job", "--trainer", dest="trainer", metavar="MODULE:FUNCTION",
                        help="the job (default: the problem's \"job\"), as MODULE:FUNCTION or "
                             "path/to/train.py:FUNCTION: a loop function `def train(ctx, **args)` run once per rank "
                             "(thrifty.runtime.ddp.context states the contract; e.g. "
                             "thrifty.runtime.training.examples:mlp_loop), or a function returning a "
                             "thrifty.runtime.training.Trainer (e.g. thrifty.runtime.training.examples:zoo)")
    parser.add_argument("--job-args", "--trainer-args", dest="trainer_args", type=_json_object, default=None,
                        metavar="JSON", help="keyword arguments of the job's function, as a JSON object")
    parser.add_argument("--problem", metavar="PROBLEM.json", help="the plan's problem (needed to re-plan)")
    parser.add_argument("--out", "--run-dir", dest="out", metavar="DIR",
                        help="the run's folder: run record, checkpoint, run log and worker logs "
                        "(default ./thrifty-runs/RUN_ID; --run-dir is the same)")
    parser.add_argument("--resume", nargs="?", const=True, default=False, metavar="RUN_DIR",
                        help="continue the run in RUN_DIR (default: --out's folder, else the run under "
                             "./thrifty-runs/ active last) from its checkpoint; its plan, problem, trainer, settings, "
                             "cluster and plot come from its run record unless given again")
    parser.add_argument("--checkpoint", default=None, metavar="LOCATION",
                        help="where the checkpoint lives: a path, or s3://BUCKET/KEY, which every machine of a "
                             "cluster must reach (default RUN_DIR/checkpoint.pt)")
    parser.add_argument("--checkpoint-every", type=int_at_least(1), default=None, metavar="N",
                        help="iterations between checkpoints (default 100)")
    parser.add_argument("--checkpoint-every-s", type=positive_float, default=None, metavar="SECONDS",
                        help="and at most this long between them (default 60)")
    parser.add_argument("--window", type=positive_float, default=None, metavar="SECONDS",
                        help="throughput window of the progress monitor (Srifty's K); default: a tenth of the "
                             "time limit or of the predicted time, at most 300")
    parser.add_argument("--no-replan-on-slowdown", action="store_true",
                        help="re-plan on preemptions only, never because progress falls behind")
    parser.add_argument("--world-timeout", type=positive_float, default=None, metavar="SECONDS",
                        help="how long the workers may take to form their world (default 120)")
    parser.add_argument("--stall-timeout", type=positive_float, default=None, metavar="SECONDS",
                        help="stop when no iteration finishes for this long (default 600)")
    parser.add_argument("--threads", type=int_at_least(1), default=None, help="torch threads per worker (default 1)")
    parser.add_argument("--seed", type=int, default=None, help="seed of the data order and initial weights (default 0)")
    parser.add_argument("--inject", type=parse_fault, action="append", default=[], metavar="FAULT",
                        help="a fault for demos: kill:machine=0,iteration=100[,warning=120], "
                             "kill:machine=0,time=30, slow:machine=1,from=100,extra=0.05[,until=200]")
    parser.add_argument("--cluster", default=None, metavar="CLUSTER",
                        help="where the machines are: local (the default: worker processes on this host), auto "
                             "(the Ray cluster running on this host), HOST:PORT or ray://HOST:PORT (a running Ray "
                             "cluster whose nodes carry the plan's instance types as resources), or a cluster "
                             "config file (provider: ec2; see docs/ec2.md)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan, the machines it would ask for, the predicted time and cost, and exit")
    parser.add_argument("--launch-delay", type=non_negative_float, default=0.0, metavar="SECONDS",
                        help="local provider: seconds a machine takes to 'boot' (default 0)")
    parser.add_argument("--plot", type=output_file, metavar="FILE.png", help="draw progress and cost against the plans")
    parser.add_argument("--metrics", type=metrics_kinds, default=None, metavar="tensorboard,mlflow",
                        help="also write every reported loss and metric as TensorBoard event files "
                             "(RUN_DIR/tensorboard) and/or to MLflow's file store (RUN_DIR/mlruns); the "
                             "'tensorboard' and 'mlflow' extras (RUN_DIR/metrics.jsonl is always written)")
    parser.add_argument("--save-profile", type=output_file, metavar="FILE.json",
                        help="when the run ends, write the compute profile its models were corrected to online (the "
                             "profile format a problem names as its model; a profile bundle when it measured several "
                             "devices)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no live progress bar: what happens is printed as plain lines")
    parser.add_argument("--json", action="store_true", help="print only the result as JSON (implies --no-progress)")


# RunConfig field <- command-line option (None: not given)
_CONFIG_FLAGS = {"checkpoint": "checkpoint", "checkpoint_every": "checkpoint_every",
                 "checkpoint_every_s": "checkpoint_every_s",
                 "window_s": "window", "world_timeout_s": "world_timeout", "stall_timeout_s": "stall_timeout",
                 "threads": "threads", "seed": "seed", "metrics": "metrics"}


def _resume_folder(args: argparse.Namespace) -> Any:
    """False, or the folder of the run to resume: --resume's, else --out's,
    else the run under ./thrifty-runs/ active last (said on stderr)."""
    from pathlib import Path

    from thrifty.core.errors import ProblemError
    from thrifty.runtime.training.rundir import newest_run_dir

    if not args.resume:
        return False
    if isinstance(args.resume, str):
        if args.out is not None and Path(args.out).resolve() != Path(args.resume).resolve():
            raise ProblemError(f"--resume {args.resume} and --out {args.out} name two folders; give one")
        return Path(args.resume)
    if args.out is not None:
        return Path(args.out)
    folder = newest_run_dir()
    print(f"thrifty run: resuming {folder}", file=sys.stderr)
    return folder


def _config(args: argparse.Namespace, record: Any) -> Any:
    from thrifty.runtime.training.config import RunConfig

    given = {name: getattr(args, flag) for name, flag in _CONFIG_FLAGS.items() if getattr(args, flag) is not None}
    if args.no_replan_on_slowdown:
        given["replan_on_slowdown"] = False
    base = dict(record.config) if record is not None else {}
    return RunConfig(**{**base, **given})


def run(args: argparse.Namespace) -> int:
    from thrifty.core.errors import ProblemError
    from thrifty.runtime.training.driver import prepare_run
    from thrifty.runtime.training.errors import RunFinished
    from thrifty.runtime.training.preflight import RunProblems
    from thrifty.runtime.training.rundir import read_run_record

    resume = _resume_folder(args)
    if args.plan is None and not resume:
        raise ProblemError("give a plan or a problem file (or --resume RUN_DIR)")
    record = read_run_record(resume) if resume else None
    options = {k: v for k, v in (("plot", args.plot), ("launch_delay", args.launch_delay or None),
                                 ("save_profile", args.save_profile)) if v is not None}
    try:
        prepared = prepare_run(args.plan, args.trainer, problem=args.problem, config=_config(args, record),
                               faults=args.inject, run_dir=args.out, trainer_args=args.trainer_args, resume=resume,
                               cluster=args.cluster, options=options)
        plan = prepared.inputs.plan
        if not plan.feasible:
            why = plan.infeasibility.reason if plan.infeasibility else plan.status
            print(f"thrifty run: the problem is infeasible: {why}", file=sys.stderr)
            return EXIT_INFEASIBLE
        if args.dry_run:  # nothing runs; what the run would refuse before it starts is refused here, all at once
            from thrifty.runtime.metrics import check_kinds
            from thrifty.runtime.training.preflight import check_run

            check_kinds(prepared.config.metrics)  # a metrics sink whose package is missing
            check_run(prepared.inputs)
            return _dry_run(prepared, args.json)
        return _run(args, prepared)
    except RunFinished as e:
        print(f"thrifty run: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps({"run_dir": str(e.run_dir), "finished": True, **e.finish}, indent=1))
        return EXIT_OK
    except RunProblems as e:
        for problem in e.problems:
            print(f"thrifty run: error: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _run(args: argparse.Namespace, prepared: Any) -> int:
    """Start the run `prepared` says, watch it, and say how it ended."""
    from thrifty.runtime.training.driver import train
    from thrifty.runtime.training.errors import ReplanInfeasible, RunInterrupted, Terminated, TrainingError
    from thrifty.runtime.training.hooks import Hooks

    from thrifty.runtime.cluster.spec import cluster_kind

    inputs, options = prepared.inputs, prepared.options
    kind = cluster_kind(inputs.cluster)
    launch_delay = options.get("launch_delay") or 0.0
    provider = None
    if launch_delay and kind != "local":
        from thrifty.core.errors import ProblemError

        raise ProblemError("--launch-delay simulates boot times of local machines; it does not apply to "
                           f"--cluster {inputs.cluster}")
    if launch_delay:
        import uuid

        from thrifty.runtime.providers.local import LocalProvider

        provider = LocalProvider(uuid.uuid4().hex[:8], inputs.problem.catalog, launch_delay_s=launch_delay)
    hooks = Hooks()
    bar = _ProgressBar(enabled=not (args.json or args.no_progress))
    hooks.on("preemption", lambda e: bar.say(f"[red]preempted[/red] {e.instance_type} ({e.market}) "
                                             f"{e.machine_id or ''} via {e.source}"))
    hooks.on("slowdown", lambda v: bar.say(f"[yellow]behind[/yellow]: optimistic finish "
                                           f"{_num(v.optimistic_total_s, '.1f')} s breaks the "
                                           f"{', '.join(v.violation)} limit"))
    hooks.on("replanned", lambda r: bar.say(f"[magenta]re-planned[/magenta] ({r.reason}, {r.latency_s * 1e3:.0f} ms):"
                                            f" {r.old_config} -> {r.new_config}" + (
                                                f" [yellow]finishing late[/yellow] ({r.best_effort}): the soonest "
                                                "plan within the budget" if r.best_effort else "")
                                            + (f"; assuming {r.assumed}" if r.assumed else "")))
    hooks.on("calibrated", lambda c: bar.say(f"[cyan]calibrated[/cyan]: {_calibrated(c)}")
             if c["window"] == 1 else None)
    hooks.on("infeasible_forecast", lambda f: bar.say(f"[red]limits out of reach[/red]: {f}"))
    hooks.on("prediction_off", lambda off: bar.say(f"[yellow]prediction off[/yellow]: {off}"))
    result, code, folder = None, EXIT_OK, prepared.folder
    try:
        with _stdout_to_stderr(), _sigterm_interrupts(), bar:
            result = train(inputs.plan, inputs.trainer, problem=inputs.problem, provider=provider, hooks=hooks,
                           config=prepared.config, faults=inputs.faults, run_dir=None if inputs.resuming else folder,
                           trainer_args=inputs.trainer_args, resume=folder if inputs.resuming else False,
                           on_progress=bar.update, run_id=prepared.run_id, cluster=inputs.cluster, options=options)
    except ReplanInfeasible as e:
        _report(args, prepared)
        print(f"thrifty run: infeasible after re-planning: {e}{_kept(e)}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except TrainingError as e:
        _report(args, prepared)
        print(f"thrifty run: failed: {e}{_kept(e)}", file=sys.stderr)
        return EXIT_FAILURE
    except RunInterrupted as e:
        _report(args, prepared)
        print(f"thrifty run: {e}; resume with: thrifty run --resume {e.run_dir}", file=sys.stderr)
        return EXIT_TERMINATED if e.signal == "SIGTERM" else EXIT_INTERRUPTED
    except Terminated:  # before the run's loop started: nothing to resume from yet
        print("thrifty run: terminated (SIGTERM) before the run started", file=sys.stderr)
        return EXIT_TERMINATED
    finally:
        if provider is not None:
            provider.close()
    assert result is not None
    _report(args, prepared, result)
    if result.iterations != result.total_iterations:
        code = EXIT_FAILURE
    elif not result.within_limits:
        print("thrifty run: finished OUTSIDE the limits: " + "; ".join(result.exceeded), file=sys.stderr)
        code = EXIT_OUTSIDE_LIMITS
    return code


def _calibrated(event: dict) -> str:
    """A calibration window in words: the iteration's prior, corrected and measured times, and the factors."""
    measured = event["measured"]["iteration_s"]
    prior, corrected = event["prior"]["iteration_s"], event["corrected"]["iteration_s"]
    return (f"iteration {prior * 1e3:.1f} ms prior -> {corrected * 1e3:.1f} ms corrected"
            + (f" ({measured * 1e3:.1f} ms measured)" if measured else "")
            + f" after window {event['window']}: {event['assumed']}")


def _report(args: argparse.Namespace, prepared: Any, result: Any = None) -> None:
    """The timeline and the plot (``--plot``, or the one the run was started
    with) of what the run log holds, however the run ended; with a result,
    the prediction check and where the files are (``--json``: the result).
    ``--save-profile``: the corrected profile is written (said on stderr)."""
    from thrifty.core.errors import ProblemError
    from thrifty.core.validation import json_object
    from thrifty.runtime.training.calibration import save_corrected_profile
    from thrifty.runtime.training.report import format_prediction_check, format_timeline, plot_run, timeline
    from thrifty.runtime.metrics import look_at
    from thrifty.runtime.training.runlog import read_run_log

    log = prepared.folder / "run.jsonl"
    if not log.exists():
        return  # the run did not get to start
    events = read_run_log(log)
    save = prepared.options.get("save_profile")
    if save:
        try:
            what = save_corrected_profile(events, prepared.inputs.problem, save)
            print(f"thrifty run: wrote {what} to {save}", file=sys.stderr)
        except ProblemError as e:
            print(f"thrifty run: --save-profile {save}: {e.message}", file=sys.stderr)
    plot = prepared.options.get("plot")
    if plot:
        problem = prepared.inputs.problem
        plot_run(events, plot, title=f"{problem.name or problem.model}: run {prepared.run_id}")
    if args.json:
        if result is not None:
            print(json.dumps(json_object(result), indent=1))
        return
    print(format_timeline(timeline(events)))
    if result is not None:
        check = format_prediction_check([json_object(s) for s in result.segments])
        if check:
            print(check)
        print(f"run log: {result.log_path}; checkpoint: {result.checkpoint_path}"
              + (f"; plot: {plot}" if plot else ""))
        for line in look_at(prepared.folder, ("jsonl", *prepared.config.metrics)):
            print(line)
    elif plot:
        print(f"plot: {plot}")


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While the run goes, SIGTERM stops it as Ctrl-C does (`Terminated`, a
    KeyboardInterrupt: the workers checkpoint and stop, exit 143). Only in
    the main thread, where Python delivers signals, and unless the run was
    started ignoring SIGTERM: then it stays ignored, as an ignored Ctrl-C does."""
    import threading

    from thrifty.runtime.training.errors import Terminated

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """While the run goes, file descriptor 1 is stderr: the progress bar and
    whatever libraries print (Ray's core and log monitor write to stdout, e.g.
    that a node died) go there, and stdout holds only thrifty's answer, the
    timeline or ``--json``'s object, printed after. Nothing to do when stdout
    is not a file descriptor (captured)."""
    try:
        sys.stdout.flush()
        fd, err = sys.stdout.fileno(), sys.stderr.fileno()
    except (OSError, ValueError, AttributeError):
        yield
        return
    saved = os.dup(fd)
    os.dup2(err, fd)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, fd)
        os.close(saved)


def _dry_run(prepared: Any, as_json: bool) -> int:
    """What a run would do, without starting anything: the plan, its
    machines, the prediction (after `check_run` found nothing wrong)."""
    from thrifty.runtime.cluster.spec import cluster_kind

    plan, problem, cluster = prepared.inputs.plan, prepared.inputs.problem, prepared.inputs.cluster or "local"
    kind = cluster_kind(cluster)
    machines = [{"instance_type": a.instance_type, "market": a.market, "count": a.count,
                 "batch_per_machine": a.batch_per_instance} for a in plan.allocation]
    p = plan.predicted
    summary = {"cluster": str(cluster), "cluster_kind": kind, "config": plan.config, "machines": machines,
               "iterations": problem.iterations, "global_batch": problem.global_batch,
               "predicted_total_s": p.total_s if p else None, "predicted_cost_usd": p.cost_usd if p else None,
               "time_limit_s": problem.limits.time_s, "cost_limit_usd": problem.limits.cost_usd,
               "run_dir": str(prepared.folder), "resumed": prepared.inputs.resuming}
    where = {"local": "worker processes on this host", "ray": f"the Ray cluster at {cluster}"}.get(kind, "")
    if kind == "config":
        from thrifty.runtime.providers.config import load_cluster_config

        config = load_cluster_config(str(cluster))
        head = config.head_address or f"{config.head_ip or 'this host'}:{config.ray_port}"
        summary.update(provider=config.provider, region=config.region, head=head)
        where = (f"{config.provider} machines in {config.region} ({cluster}) joining a Ray head at {head} "
                 f"(thrifty installed: {config.install})")
    provenance = _plan_provenance(plan, problem)
    summary["provenance"] = {name: p.model_dump() for name, p in provenance.items()}
    if as_json:
        print(json.dumps(summary, indent=1))
        return EXIT_OK
    resumed = f" (resuming {prepared.folder})" if prepared.inputs.resuming else ""
    print(f"dry run{resumed}: {problem.iterations} iterations of global batch {problem.global_batch} on {where}")
    for m in machines:
        print(f"  {m['count']} x {m['instance_type']} ({m['market']}), batch {m['batch_per_machine']} per machine")
    if p is not None:
        limits = [f"time <= {problem.limits.time_s:g} s" if problem.limits.time_s is not None else "",
                  f"cost <= ${problem.limits.cost_usd:g}" if problem.limits.cost_usd is not None else ""]
        print(f"predicted: {p.total_s:,.1f} s, ${p.cost_usd:,.4f}; iteration {p.iteration_s * 1e3:.1f} ms"
              + (f" (limits: {', '.join(x for x in limits if x)})" if any(limits) else ""))
    from thrifty.solver.plan import provenance_lines

    print("where the figures came from:")
    for line in provenance_lines(provenance):
        print(f"  {line}")
    print("every check a run makes before it starts passed; nothing was started (--dry-run)")
    return EXIT_OK


def _plan_provenance(plan: Any, problem: Any) -> dict[str, Any]:
    """Where the plan's figures came from: as `thrifty solve` recorded it in
    the plan, or (a plan written by hand, or before plans said) as the
    problem's models give them for each of its types."""
    if plan.provenance is not None:
        return dict(plan.provenance)
    from thrifty.solver.solve import plan_provenance
    from thrifty.solver.training import TrainingSpace

    return plan_provenance(TrainingSpace(problem))


def _kept(error: Any) -> str:
    """Where a stopped run's checkpoint is and how to go on from it."""
    if error.run_dir is None:
        return ""
    return (f"\nthe checkpoint at iteration {error.checkpoint_iteration} is kept; resume with: "
            f"thrifty run --resume {error.run_dir}")


class _ProgressBar:
    """A rich progress bar: iterations, the measured throughput with its sd,
    and the elapsed time and cost against what the current plan predicted.
    Disabled (``--no-progress``, ``--json``), there is no bar and what it
    would say is a plain line on stderr."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.progress: Progress | None = None
        self.task: TaskID | None = None

    def __enter__(self) -> "_ProgressBar":
        return self

    def _start(self) -> None:
        """Shown from the first report on, so that bad input is one line, not a bar."""
        from rich.progress import BarColumn, Progress, TextColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=20),
                                 TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[rate]}"),
                                 TextColumn("{task.fields[time]}"), TextColumn("{task.fields[cost]}"),
                                 transient=False, redirect_stdout=False)
        self.progress.__enter__()
        self.task = self.progress.add_task("starting", total=1, rate="", time="", cost="")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.progress is not None:
            self.progress.__exit__(exc_type, exc, traceback)

    def say(self, text: str) -> None:
        if not self.enabled:  # --no-progress, --json: a plain line
            from rich.text import Text

            print(Text.from_markup(text).plain, file=sys.stderr, flush=True)
            return
        if self.progress is None:
            self._start()
        if self.progress is not None:
            self.progress.console.print(text)

    def update(self, s: Any) -> None:
        if not self.enabled:
            return
        if self.progress is None:
            self._start()
        assert self.progress is not None and self.task is not None  # _start made them
        w = s.window
        rate = f"{w.mean:.1f}±{w.sd:.1f} it/s" if w is not None else "-- it/s"
        if s.eta_s is not None:
            rate += f" ETA {s.eta_s:.0f}s"
        if s.loss is not None:
            rate += f" loss {s.loss:.4g}" + "".join(f" {k} {v:.3g}" for k, v in (s.metrics or {}).items())
        # actual and projected against the plan's prediction and the limit
        time_text = f"{s.elapsed_s:.0f}s→{_num(s.projected_total_s)}s (plan {_num(s.predicted_total_s)}" \
                    f"{'' if s.time_limit_s is None else f', ≤{s.time_limit_s:g}'})"
        cost_text = f"${s.spent_usd:.4f} (plan ${_num(s.predicted_cost_usd, '.4f')}" \
                    f"{'' if s.cost_limit_usd is None else f', ≤${s.cost_limit_usd:g}'})"
        self.progress.update(self.task, description=s.state, completed=s.iterations,
                             total=s.total_iterations, rate=rate, time=time_text, cost=cost_text)


def _num(value: float | None, fmt: str = ".0f") -> str:
    return "--" if value is None else format(value, fmt)
