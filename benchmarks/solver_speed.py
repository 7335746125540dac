"""Speed and quality of the training solver (issue 3), side by side with baselines.

0. The main job (``thrifty solve datasets/examples/heterogeneous-resnet50.json``,
   the README's): the CLI's end-to-end time, the real ``thrifty`` console
   script in a fresh process, median and minimum of 10 runs, beside the time of
   the search inside it (the plan's ``solver.wall_s``). Target: median <= 0.5 s.
   One run first, not counted, with Python's bytecode cache written (as ``pip
   install`` compiles it): the figures are those of an installed thrifty, not of
   the first run after an edit.
1. Paper scale (3 instance types, quotas <= 64, global batch <= 8192): the
   Srifty 5.2 case studies and a paper-scale synthetic problem; ``solve()`` time
   of each method, and ``thrifty solve`` end to end (a fresh process).
   Targets: solve() <= 1 s, thrifty solve <= 2 s (Srifty: 0.8-6.5 s).
2. Large scale (10 types, quota 256 each, spot and on-demand of each): the
   ``ilp`` method's time (target <= 10 s) and its objective against the
   exhaustive optimum on a reduced instance (target within 1%).
3. Candidates simulated per second.
4. The case studies: thrifty's plan next to Srifty's anchor approximation,
   CGF, FGF, the best homogeneous plan and APM-driven optimization, all judged
   by thrifty's simulator.

Run: ``python benchmarks/solver_speed.py`` (``--main-only``: only 0;
``--large-only``: only 2).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from thrifty.solver.baselines import BASELINES
from thrifty.solver.problem import load_problem, parse_problem
from thrifty.solver.solve import solve
from thrifty.solver.training import TrainingSpace

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "datasets" / "examples").glob("srifty-case*.json"))
console = Console(width=200)

MAIN_JOB = ROOT / "datasets" / "examples" / "heterogeneous-resnet50.json"
MAIN_JOB_RUNS = 10
MAIN_JOB_TARGET_S = 0.5

LARGE_TYPES = ["p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "g3.4xlarge", "g3.8xlarge", "g4dn.xlarge",
               "g4dn.12xlarge", "g5.xlarge", "g5.12xlarge", "g6.xlarge"]


def _fmt_obj(plan) -> str:
    if not plan.feasible:
        return "infeasible"
    return f"${plan.objective_value:.4f}" if plan.objective == "min_cost" else f"{plan.objective_value:.1f} s"


METHOD_BUDGET_S = 30.0  # per solve; a method that needs longer reports its best plan and gap


def timed_solve(problem, method: str):
    space = TrainingSpace(problem)
    start = time.perf_counter()
    plan = solve(problem, method=method, space=space, time_limit_s=METHOD_BUDGET_S)
    return plan, time.perf_counter() - start


def _thrifty_command() -> list[str]:
    """The installed ``thrifty`` console script (next to this Python), else the module it runs."""
    script = Path(sys.executable).with_name("thrifty")
    if script.exists():
        return [str(script)]
    found = shutil.which("thrifty")
    return [found] if found else [sys.executable, "-m", "thrifty.runtime.cli"]


def _end_to_end(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Seconds from starting the command to its exit, and its stdout."""
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return wall, proc.stdout


def main_job(runs: int = MAIN_JOB_RUNS) -> None:
    command = [*_thrifty_command(), "solve", str(MAIN_JOB.relative_to(ROOT))]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    _end_to_end(command, env)  # writes the bytecode cache, as an install does; not counted
    table = Table(title=f"The main job end to end: {' '.join(['thrifty', *command[-2:]])} "
                        f"({runs} runs each, a fresh process per run)")
    for col in ("output", "median s", "min s", "max s", "search s (median)", f"median <= {MAIN_JOB_TARGET_S} s"):
        table.add_column(col, justify="right")
    for output, extra in (("table", []), ("--json", ["--json"])):
        walls, searches = [], []
        for _ in range(runs):
            wall, out = _end_to_end(command + extra, env)
            walls.append(wall)
            if extra:
                searches.append(json.loads(out)["solver"]["wall_s"])
        median = statistics.median(walls)
        table.add_row(output, f"{median:.3f}", f"{min(walls):.3f}", f"{max(walls):.3f}",
                      f"{statistics.median(searches):.4f}" if searches else "(same search)",
                      "yes" if median <= MAIN_JOB_TARGET_S else "NO")
    console.print(table)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    console.print(f"host: {os.cpu_count()} CPUs, load average {load:.2f} (other processes slow every figure)")


def paper_scale() -> None:
    problems = [(p.stem, load_problem(p)) for p in EXAMPLES]
    synthetic = parse_problem({
        "kind": "training", "name": "paper-scale synthetic", "model": "resnet50", "global_batch": 8192,
        "iterations": 1000, "objective": "min_cost", "limits": {"time_s": 3600},
        "instances": [{"instance_type": t, "market": "spot", "quota": 64}
                      for t in ("p3.8xlarge", "g3.8xlarge", "g4dn.8xlarge")]})
    problems.append(("synthetic 3x64, B=8192", synthetic))
    table = Table(title="Paper scale: solve() seconds per method, and thrifty solve end to end")
    for col in ("problem", "space", "auto", "exhaustive", "ilp", "smt", "CLI end to end", "plan", "objective"):
        table.add_column(col, justify="right")
    for name, problem in problems:
        row = [name]
        plans = {}
        space = TrainingSpace(problem)
        row.append(f"{space.size:,.0f}")
        for method in ("auto", "exhaustive", "ilp", "smt"):
            if method == "exhaustive" and space.size > 200_000:
                row.append("-")
                continue
            plan, wall = timed_solve(problem, method)
            plans[method] = plan
            flag = "" if plan.status != "feasible" and plan.solver.details.get("proven", True) else "*"
            row.append(f"{wall:.2f}{flag} ({plan.solver.candidates_simulated})")
        cli = "-"
        path = next((p for p in EXAMPLES if p.stem == name), None)
        if path is not None:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "thrifty.runtime.cli", "solve", str(path), "--json"],
                           capture_output=True, check=False)
            cli = f"{time.perf_counter() - start:.2f}"
        row.append(cli)
        auto = plans["auto"]
        row.append(auto.config or "UNSAT")
        objs = {_fmt_obj(p) for p in plans.values()}
        row.append(" / ".join(sorted(objs)))
        table.add_row(*row)
    console.print(table)
    console.print("cells: seconds (candidates simulated), * = stopped at the 30 s budget without a proof; "
                  "objective: every method's (one value = all agree)")


def large_scale() -> None:
    def problem(quota: int, types=LARGE_TYPES, global_batch: int = 4096, time_s: float = 1800) -> object:
        return parse_problem({
            "kind": "training",
            "name": f"{len(types)} types x 2 markets, quota {quota}, B={global_batch}, T<={time_s:g} s",
            "model": "resnet50", "global_batch": global_batch, "iterations": 2000, "objective": "min_cost",
            "limits": {"time_s": time_s},
            "instances": [{"instance_type": t, "market": m, "quota": quota}
                          for t in types for m in ("on_demand", "spot")]})

    table = Table(title="Large scale: ilp, and ilp against exhaustive on reduced instances")
    for col in ("instance", "space", "method", "seconds", "simulated", "objective", "gap", "plan"):
        table.add_column(col, justify="right")

    def row(p, method: str):
        plan, wall = timed_solve(p, method)
        table.add_row(p.name, f"{TrainingSpace(p).size:.3g}", method, f"{wall:.2f}",
                      str(plan.solver.candidates_simulated), _fmt_obj(plan),
                      f"{plan.solver.gap:.2%}" if plan.solver.gap is not None else "-", plan.config)
        return plan

    row(problem(256), "ilp")
    # reduced instances the exhaustive method can enumerate (1e5-2e6 candidates), with deadlines
    # tight enough that the optimum mixes markets or types
    ratios = []
    for reduced in (problem(2, LARGE_TYPES[:4], 1024, 300), problem(8, LARGE_TYPES[:3], 1024, 200),
                    problem(4, LARGE_TYPES[:2], 1024, 1800)):
        ex, ilp = row(reduced, "exhaustive"), row(reduced, "ilp")
        if ex.feasible and ilp.feasible:
            ratios.append(ilp.objective_value / ex.objective_value)
    console.print(table)
    if ratios:
        console.print(f"reduced instances: ilp objective / exhaustive optimum = "
                      f"{', '.join(f'{r:.4f}' for r in ratios)} (target <= 1.01)")


def simulation_rate() -> None:
    problem = parse_problem({
        "kind": "training", "model": "resnet50", "global_batch": 2048, "iterations": 1000,
        "objective": "min_cost", "instances": [{"instance_type": t, "market": "spot", "quota": 16}
                                               for t in ("p3.8xlarge", "g3.8xlarge", "g4dn.8xlarge")]})
    from thrifty.solver.search import search_exhaustive

    space = TrainingSpace(problem)
    res = search_exhaustive(space, prune=False)
    console.print(f"exhaustive without pruning: {res.simulated:,} candidates simulated in {res.wall_s:.2f} s "
                  f"= {res.simulated / res.wall_s:,.0f} candidates/s")


def baselines() -> None:
    table = Table(title="Case studies: thrifty vs baselines (predicted by thrifty's simulator)")
    for col in ("case", "method", "plan", "iteration", "total", "cost", "meets limits"):
        table.add_column(col, justify="right")
    for path in EXAMPLES:
        problem = load_problem(path)
        space = TrainingSpace(problem)
        plan = solve(problem, space=space)
        if plan.feasible:
            p = plan.predicted
            table.add_row(path.stem, "thrifty", plan.config, f"{p.iteration_s:.3f} s", f"{p.total_s:.0f} s",
                          f"${p.cost_usd:.3f}", "yes")
        else:
            table.add_row(path.stem, "thrifty", "UNSAT: " + ", ".join(plan.infeasibility.conflicts), "", "", "", "-")
        for name, method in BASELINES.items():
            res = method(space)
            ev = res.best
            if ev is None:
                table.add_row("", name, "no plan", "", "", "", "")
                continue
            table.add_row("", name, space.describe(ev.candidate), f"{ev.iteration_s:.3f} s", f"{ev.total_s:.0f} s",
                          f"${ev.cost_usd:.3f}", "yes" if ev.feasible else "NO")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Speed and quality of the training solver, beside baselines "
                                                 "(the module docstring lists the parts and their targets).")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--main-only", action="store_true", help="only part 0: the README's main job end to end")
    only.add_argument("--large-only", action="store_true", help="only part 2: the large-scale ilp problem")
    parser.add_argument("--runs", type=int, default=MAIN_JOB_RUNS, help="runs of the main job (default %(default)s)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs is {args.runs}, but must be at least 1")
    if args.large_only:
        large_scale()
        return 0
    main_job(args.runs)
    if args.main_only:
        return 0
    paper_scale()
    large_scale()
    simulation_rate()
    baselines()
    return 0


if __name__ == "__main__":
    sys.exit(main())
