"""``thrifty run``: carry out a training plan on machines from a provider, with a
live progress bar (predicted against actual), re-planning on preemption or a
certain slowdown (Srifty 4.5), a JSON-lines run log and a timeline at the end.

``thrifty run PLAN.json --problem PROBLEM.json --trainer MODULE:FACTORY``; a
problem file in place of the plan is solved first.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from thrifty.runtime.cli import EXIT_FAILURE, EXIT_INFEASIBLE, EXIT_OK
from thrifty.runtime.commands._args import int_at_least, non_negative_float, positive_float

HELP = "run a training plan (local worker processes by default), watch it and re-plan on preemption"

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
    from thrifty.datasets.errors import ProblemError
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN.json",
                        help="a plan from `thrifty solve --out`, or a training problem to solve first")
    parser.add_argument("--trainer", required=True, metavar="MODULE:FACTORY",
                        help="a function returning thrifty.runtime.training.Trainer "
                             "(e.g. thrifty.runtime.training.examples:zoo)")
    parser.add_argument("--trainer-args", type=_json_object, default={}, metavar="JSON",
                        help="keyword arguments of the trainer factory, as a JSON object")
    parser.add_argument("--problem", metavar="PROBLEM.json", help="the plan's problem (needed to re-plan)")
    parser.add_argument("--run-dir", metavar="DIR", help="checkpoint, run log and worker logs "
                        "(default ./thrifty-runs/RUN_ID)")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --run-dir")
    parser.add_argument("--checkpoint-every", type=int_at_least(1), default=100, metavar="N",
                        help="iterations between checkpoints (default 100)")
    parser.add_argument("--checkpoint-every-s", type=positive_float, default=60.0, metavar="SECONDS",
                        help="and at most this long between them (default 60)")
    parser.add_argument("--window", type=positive_float, default=300.0, metavar="SECONDS",
                        help="throughput window of the progress monitor (Srifty's K; default 300)")
    parser.add_argument("--no-replan-on-slowdown", action="store_true",
                        help="re-plan on preemptions only, never because progress falls behind")
    parser.add_argument("--world-timeout", type=positive_float, default=120.0, metavar="SECONDS",
                        help="how long the workers may take to form their world (default 120)")
    parser.add_argument("--stall-timeout", type=positive_float, default=600.0, metavar="SECONDS",
                        help="stop when no iteration finishes for this long (default 600)")
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="torch threads per worker")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data order and initial weights")
    parser.add_argument("--inject", type=parse_fault, action="append", default=[], metavar="FAULT",
                        help="a fault for demos: kill:machine=0,iteration=100[,warning=120], "
                             "kill:machine=0,time=30, slow:machine=1,from=100,extra=0.05[,until=200]")
    parser.add_argument("--launch-delay", type=non_negative_float, default=0.0, metavar="SECONDS",
                        help="local provider: seconds a machine takes to 'boot' (default 0)")
    parser.add_argument("--plot", metavar="FILE.png", help="draw progress and cost against the plans")
    parser.add_argument("--json", action="store_true", help="print only the result as JSON")


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    """(plan, problem): a problem given as PLAN.json is solved here."""
    from thrifty.datasets.errors import ProblemError
    from thrifty.datasets.io import read_json
    from thrifty.runtime.training.plans import plan_from_dict
    from thrifty.solver.problem import load_problem

    data = read_json(args.plan)
    if isinstance(data, dict) and "allocation" not in data and data.get("kind") == "training":
        if args.problem:
            raise ProblemError("is a problem, and --problem names another one: give a plan with --problem, "
                               "or the problem alone", source=args.plan)
        from thrifty.solver.solve import solve

        problem = load_problem(args.plan)
        return solve(problem), problem
    if not args.problem:
        raise ProblemError("--problem PROBLEM.json is required with a plan (the runtime re-plans with it)")
    return plan_from_dict(data, source=args.plan), load_problem(args.problem)


def run(args: argparse.Namespace) -> int:
    from thrifty.runtime.training.driver import RunConfig, train
    from thrifty.runtime.training.errors import ReplanInfeasible
    from thrifty.runtime.training.hooks import Hooks

    plan, problem = _load(args)
    if not plan.feasible:
        why = plan.infeasibility.reason if plan.infeasibility else plan.status
        print(f"thrifty run: the problem is infeasible: {why}", file=sys.stderr)
        return EXIT_INFEASIBLE
    config = RunConfig(checkpoint_every=args.checkpoint_every, checkpoint_every_s=args.checkpoint_every_s,
                       window_s=args.window, replan_on_slowdown=not args.no_replan_on_slowdown,
                       world_timeout_s=args.world_timeout, stall_timeout_s=args.stall_timeout, threads=args.threads,
                       seed=args.seed)
    provider = None
    if args.launch_delay:
        import uuid

        from thrifty.runtime.providers.local import LocalProvider

        provider = LocalProvider(uuid.uuid4().hex[:8], problem.catalog, launch_delay_s=args.launch_delay)
    hooks = Hooks()
    bar = _ProgressBar(enabled=not args.json)
    hooks.on("preemption", lambda e: bar.say(f"[red]preempted[/red] {e.instance_type} ({e.market}) "
                                             f"{e.machine_id or ''} via {e.source}"))
    hooks.on("slowdown", lambda v: bar.say(f"[yellow]behind[/yellow]: optimistic finish "
                                           f"{_num(v.optimistic_total_s, '.1f')} s breaks the "
                                           f"{', '.join(v.violation)} limit"))
    hooks.on("replanned", lambda r: bar.say(f"[magenta]re-planned[/magenta] ({r.reason}, {r.latency_s * 1e3:.0f} ms):"
                                            f" {r.old_config} -> {r.new_config}"))
    try:
        with bar:
            result = train(plan, args.trainer, problem=problem, provider=provider, hooks=hooks, config=config,
                           faults=args.inject, run_dir=args.run_dir, trainer_args=args.trainer_args,
                           resume=args.resume, on_progress=bar.update)
    except ReplanInfeasible as e:
        print(f"thrifty run: infeasible after re-planning: {e}", file=sys.stderr)
        return EXIT_INFEASIBLE
    finally:
        if provider is not None:
            provider.close()
    from thrifty.runtime.training.report import format_timeline, plot_run, timeline
    from thrifty.runtime.training.runlog import read_run_log

    events = read_run_log(result.log_path)
    if args.plot:
        plot_run(events, args.plot, title=f"{problem.name or problem.model}: run {result.run_id}")
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(format_timeline(timeline(events)))
        print(f"run log: {result.log_path}; checkpoint: {result.checkpoint_path}")
    return EXIT_OK if result.iterations == result.total_iterations else EXIT_FAILURE


class _ProgressBar:
    """A rich progress bar: iterations, the measured throughput with its sd,
    and the elapsed time and cost against what the current plan predicted."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.progress = self.task = None

    def __enter__(self) -> "_ProgressBar":
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(bar_width=20),
                                     TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[rate]}"),
                                     TextColumn("{task.fields[time]}"), TextColumn("{task.fields[cost]}"),
                                     transient=False, redirect_stdout=False)
            self.progress.__enter__()
            self.task = self.progress.add_task("starting", total=1, rate="", time="", cost="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def say(self, text: str) -> None:
        if self.progress is not None:
            self.progress.console.print(text)

    def update(self, s: Any) -> None:
        if self.progress is None:
            return
        w = s.window
        rate = f"{w.mean:.1f}±{w.sd:.1f} it/s" if w is not None else "-- it/s"
        # actual and projected against the plan's prediction and the limit
        time_text = f"{s.elapsed_s:.0f}s→{_num(s.projected_total_s)}s (plan {_num(s.predicted_total_s)}" \
                    f"{'' if s.time_limit_s is None else f', ≤{s.time_limit_s:g}'})"
        cost_text = f"${s.spent_usd:.4f} (plan ${_num(s.predicted_cost_usd, '.4f')}" \
                    f"{'' if s.cost_limit_usd is None else f', ≤${s.cost_limit_usd:g}'})"
        self.progress.update(self.task, description=s.state, completed=s.iterations,
                             total=s.total_iterations, rate=rate, time=time_text, cost=cost_text)


def _num(value: float | None, fmt: str = ".0f") -> str:
    return "--" if value is None else format(value, fmt)
