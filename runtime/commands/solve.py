"""``thrifty solve``: plan a training job or a tuning job (``kind: "tuning"``,
RubberBand) from a problem file (JSON or YAML)."""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING

from thrifty.runtime.cli import EXIT_INFEASIBLE, EXIT_OK
from thrifty.runtime.commands._args import output_file, positive_float, with_exit_codes

if TYPE_CHECKING:
    from thrifty.solver.plan import Infeasibility

HELP = ("choose machines and batches for a training job, or per-stage allocations for a tuning job "
        "(problem file: JSON or YAML), under time, cost and quota limits")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: "a plan was found", 1: "a solver backend broke",
                             3: "no plan meets the limits; the answer says why and what to relax"})
    parser.add_argument("problem", metavar="PROBLEM",
                        help="a problem file, JSON or YAML (see `thrifty schema training` and `thrifty schema "
                             "tuning`); the files it names are read from its folder")
    parser.add_argument("--method", choices=("auto", "exhaustive", "ilp", "smt"), default="auto",
                        help="auto (default): exhaustive for small spaces, else ilp")
    parser.add_argument("--time-limit", type=positive_float, metavar="SECONDS",
                        help="stop searching after this long")
    parser.add_argument("--json", action="store_true", help="print only the plan as JSON")
    parser.add_argument("--out", type=output_file, metavar="PLAN.json",
                        help="also write the plan to this file (atomically)")
    parser.add_argument("--plot", type=output_file, metavar="FILE.png",
                        help="draw the simulated candidates, limits and plan")


def run(args: argparse.Namespace) -> int:
    from thrifty.core.errors import in_file
    from thrifty.solver.problem import load_problem
    from thrifty.solver.solve import solve
    from thrifty.solver.training import TrainingSpace

    problem = load_problem(args.problem)
    with in_file(args.problem):
        if problem.kind == "tuning":
            return _run_tuning(args, problem)
        space = TrainingSpace(problem)
        plan = solve(problem, method=args.method, time_limit_s=args.time_limit, space=space)

    def plot(path: str) -> None:
        from thrifty.runtime.plots import plot_training_plan

        plot_training_plan(space, plan, path)

    return _emit(args, problem, plan, plot, _print_human)


def _emit(args: argparse.Namespace, problem, plan, plot, print_human) -> int:
    """The plan to `--out` (atomically), the plot to `--plot`, the plan JSON or
    the human report to stdout; the exit code of the plan's status."""
    from thrifty.core.io import atomic_write_text

    if args.out:
        atomic_write_text(args.out, plan.to_json() + "\n")
    if args.plot:
        plot(args.plot)
    if args.json:
        print(plan.to_json())
    else:
        print_human(problem, plan)
    return EXIT_OK if plan.feasible else EXIT_INFEASIBLE


def _print_human(problem, plan) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    title = f"{problem.name or problem.model}: global batch {problem.global_batch}, {problem.iterations} iterations, " \
            f"{problem.objective.replace('_', ' ')}"
    limits = []
    if problem.limits.time_s is not None:
        limits.append(f"time <= {problem.limits.time_s:g} s")
    if problem.limits.cost_usd is not None:
        limits.append(f"cost <= ${problem.limits.cost_usd:g}")
    console.print(f"[bold]{title}[/bold]" + (f"  ({', '.join(limits)})" if limits else ""))
    if not plan.feasible:
        for line in infeasibility_lines(plan.infeasibility):
            console.print(line, highlight=False)
        print_provenance(console, plan)
        console.print(f"[dim]solver: {plan.solver.method}, {plan.solver.wall_s:.2f} s[/dim]")
        return
    table = Table(title=f"plan ({plan.status})")
    for col in ("instance type", "market", "count", "batch per machine"):
        table.add_column(col, justify="right" if col in ("count", "batch per machine") else "left")
    for a in plan.allocation:
        table.add_row(a.instance_type, a.market.replace("_", "-"), str(a.count), str(a.batch_per_instance))
    console.print(table)
    p = plan.predicted
    console.print(f"iteration {p.iteration_s * 1e3:,.1f} ms (p95 {p.iteration_s_p95 * 1e3:,.1f} ms), "
                  f"{p.throughput_samples_s:,.0f} samples/s")
    console.print(f"total {p.total_s:,.1f} s (p95 {p.total_s_p95:,.1f} s), cost ${p.cost_usd:,.4f}")
    print_provenance(console, plan)
    gap = ("proven optimal" if plan.solver.gap == 0 else f"gap {plan.solver.gap:.2%}" if plan.solver.gap
           else "gap unknown")
    console.print(f"[dim]solver: {plan.solver.method}, {plan.solver.wall_s:.2f} s, "
                  f"{plan.solver.candidates_simulated} candidates simulated, {gap}[/dim]")


def print_provenance(console, plan) -> None:
    """Where the plan's figures came from, per type (`provenance_lines`):
    a FALLBACK line in bold."""
    from thrifty.solver.plan import provenance_lines

    lines = provenance_lines(plan.provenance)
    if lines:
        console.print("where the figures came from:", highlight=False)
    for line in lines:
        console.print("  " + line, markup=False, highlight=False, soft_wrap=True,
                      style="bold" if "FALLBACK" in line else None)


def infeasibility_lines(why: Infeasibility) -> list[str]:
    """An infeasible answer in plain words (the `Infeasibility` of a training
    or a tuning plan): every minimal conflict set with its reason, and every
    relaxation with the plan it admits."""
    sets = why.conflict_sets or [why.conflicts]
    reasons = why.conflict_reasons
    if len(reasons) != len(sets):
        reasons = [why.reason] * len(sets)
    if not any(sets):
        lines = [f"[bold red]infeasible[/bold red]: {why.reason}"]
        if not why.conflict_sets_complete and not why.relaxations:
            return lines  # nothing was analysed (a search stopped by its time limit): the reason says so
    elif len(sets) == 1:  # "relax one" holds when the enumeration was complete: then it is the only conflict
        lines = [f"[bold red]infeasible[/bold red]: {reasons[0]}",
                 "conflict: " + ", ".join(sets[0]) + (" (relax one of them)" if why.conflict_sets_complete else "")]
    else:
        lines = [f"[bold red]infeasible[/bold red]: {len(sets)} separate conflicts (relax one member of each)"]
        lines += [f"  {k}. " + ", ".join(s) + f": {r}" for k, (s, r) in enumerate(zip(sets, reasons), 1)]
    if not why.conflict_sets_complete:
        lines.append("  (the search for conflict sets stopped early: there may be others)")
    if why.relaxations:
        lines.append("each of these admits a plan:")
        lines += ["  - " + relaxation_text(r) for r in why.relaxations]
    else:
        lines.append("no relaxation that admits a plan was found")
    return lines


def relaxation_text(r: dict) -> str:
    """One relaxation in words, with what it buys: "raise instances[0].quota
    from 4 to 32: then 32xg4dn.8xlarge@128 takes 49.8 s and costs $0.4297"."""
    changes = r.get("changes") or ({r["field"]: r["needed"]} if "field" in r else r["needed"])
    current = r["current"] if isinstance(r.get("current"), dict) else {r.get("field"): r.get("current")}
    parts: list[str] = []
    last = None  # the verb of the previous part, not repeated
    for name, value in changes.items():
        now = current.get(name)
        if isinstance(value, (bool, str)):
            parts.append(f"set {name} to {json.dumps(value)} (now {json.dumps(now)})")
        else:
            verb = "lower" if now is not None and value < now else "raise"
            said = verb == last
            last = verb
            parts.append(f"{'' if said else verb + ' '}{name} from {_with_unit(name, now, up=False)} to "
                         f"{_with_unit(name, value)}")
    text = " and ".join(parts)
    if r.get("note"):
        text += f" ({r['note']})"
    if "plan" in r:
        plan = r["plan"]
        if isinstance(plan, list):  # a tuning plan's stages
            most = max((s["instances"] for s in plan), default=0)
            plan = f"the plan ({len(plan)} stages, at most {most} instances)"
        text += f": then {plan} takes {r['total_s']:,.1f} s and costs ${r['cost_usd']:,.4f}"
    return text


def _with_unit(name: str, value, up: bool = True) -> str:
    """A field's value as printed: limits rounded up (`limit_text`) with their unit."""
    if value is None:
        return "none"
    if name in ("limits.time_s", "deadline_s"):
        return f"{limit_text(value) if up else _fmt(value)} s"
    if name == "limits.cost_usd":
        return f"${limit_text(value) if up else _fmt(value)}"
    return str(value)


def limit_text(value: float) -> str:
    """A limit that must be raised to `value`, rounded up at 4 significant
    digits: the printed figure is never below what is needed, and at most 0.1%
    above it (so 1% below it is still short)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or not math.isfinite(value):
        return _fmt(value)
    exponent = math.floor(math.log10(value))
    decimals = max(0, 3 - exponent)
    step = 10.0 ** (exponent - 3)
    units = math.ceil(value / step)
    while True:
        text = f"{units * step:,.{decimals}f}"
        if float(text.replace(",", "")) >= value:
            return text
        units += 1


def _fmt(value) -> str:
    return f"{value:,.4g}" if isinstance(value, float) else str(value)


def _run_tuning(args: argparse.Namespace, problem) -> int:
    from thrifty.solver.tuning import TuningSpace
    from thrifty.solver.solve import solve_tuning

    space = TuningSpace(problem)
    plan = solve_tuning(problem, time_limit_s=args.time_limit, space=space)

    def plot(path: str) -> None:
        from thrifty.runtime.plots import plot_tuning_plan

        plot_tuning_plan(plan, path)

    return _emit(args, problem, plan, plot, _print_tuning)


def _ratio(cost: float, ours: float) -> str:
    """A baseline's cost as a multiple of the plan's ("-" when the plan is free:
    machines priced at 0, such as local ones)."""
    if ours > 0:
        return f"{cost / ours:.2f}x"
    return "1.00x" if cost == 0 else "-"


def _print_tuning(problem, plan) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{problem.name or problem.model}: {plan.experiment}, {problem.billing.replace('_', '-')} "
                  f"billing[/bold]  ({problem.deadline_on} JCT <= {problem.deadline_s:g} s)")
    if not plan.feasible:
        for line in infeasibility_lines(plan.infeasibility):
            console.print(line, highlight=False)
        print_provenance(console, plan)
        console.print(f"[dim]solver: {plan.solver.wall_s:.2f} s[/dim]")
        return
    table = Table(title=f"tuning plan ({plan.status}, {plan.solver.chosen})")
    for col in ("stage", "trials", "iters/trial", "GPUs/trial", "instances", "GPUs", "type", "start s", "end s"):
        table.add_column(col, justify="left" if col == "type" else "right")
    for k, s in enumerate(plan.stages):
        table.add_row(str(k), str(s.trials), str(s.iters_per_trial), str(s.gpus_per_trial), str(s.instances),
                      str(s.gpus), s.instance_type, f"{s.start_s:,.0f}", f"{s.end_s:,.0f}")
    console.print(table)
    p = plan.predicted
    console.print(f"JCT {p.jct_s:,.1f} s (p95 {p.jct_s_p95:,.1f} s), cost ${p.cost_usd:,.2f} "
                  f"(p95 ${p.cost_usd_p95:,.2f})")
    print_provenance(console, plan)
    base = Table(title="against baselines (simulated)")
    for col in ("planner", "JCT s", "cost $", "vs thrifty"):
        base.add_column(col, justify="left" if col == "planner" else "right")
    for name, b in plan.baselines.items():
        q = b.predicted
        if q is None:
            base.add_row(name.replace("_", " "), "-", "infeasible", "-")
        else:
            base.add_row(name.replace("_", " "), f"{q.jct_s:,.1f}", f"{q.cost_usd:,.2f}",
                         _ratio(q.cost_usd, p.cost_usd))
    console.print(base)
    console.print(f"[dim]{plan.solver.note}; planning {plan.solver.wall_s:.2f} s, "
                  f"{plan.solver.simulations} simulations[/dim]")
