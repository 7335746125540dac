"""Overheads of running a plan on a Ray cluster, side by side with the local
launcher on the same plan (issue 16).

The plan is the Srifty 5.4 miniature's (``datasets/examples/local-demo-srifty54.json``:
two local-a spot machines, 600 iterations of the tiny transformer, global
batch 64). The local launcher forks every rank on this host from one fork
server; the Ray launcher runs them on a three-node Ray cluster on this host
(every node bound to 127.0.0.1; an agent per machine forks its ranks from
that node's fork server; rank 0's machine hosts the rendezvous store). For
each launcher, three kinds of run:

- clean: time from machines ready to the first iteration (the first
  world's launch: agents, fork servers, process group), and the steady-state
  iteration time from the workers' clock;
- machine lost without notice at iteration 320 (local: the fault injector
  kills the machine's worker; Ray: the node is removed from the cluster):
  re-plan latency from the event to training again, and iterations lost;
- spot notice 10 s before the machine goes (local: the injector's notice;
  Ray: the node's IMDSv2 server posts it, the node's agent reads it): the
  same figures.

Everything runs on this host (2 CPU cores), so the per-iteration figures move
with its load (printed). ``python benchmarks/cluster_overheads.py
[--repeats 2] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the local Ray cluster and IMDS stand-ins the tests use

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from thrifty.datasets.catalog import load_catalog  # noqa: E402
from thrifty.runtime.training import KillWorker, RunConfig, TrainingError, read_run_log, train  # noqa: E402
from thrifty.runtime.training.launcher import WORKER_PRELOAD  # noqa: E402
from thrifty.solver import solve  # noqa: E402
from thrifty.solver.problem import load_problem  # noqa: E402

DEMO = ROOT / "datasets" / "examples" / "local-demo-srifty54.json"
CATALOG = ROOT / "datasets" / "examples" / "local-demo-catalog.json"
ZOO = "thrifty.runtime.training.examples:zoo"
AT = 320  # between two checkpoints (every 50): a loss without notice loses what follows the last one
NOTICE_S = 10.0
# no slowdown re-plans: a clean run keeps its plan, so its iteration time compares launchers
CONFIG = RunConfig(checkpoint_every=50, checkpoint_every_s=None, poll_s=0.02, world_timeout_s=120,
                   stall_timeout_s=120, stop_timeout_s=60, replan_on_slowdown=False)
console = Console(width=140)


def figures(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's figures from its run log."""
    ends = [e for e in events if e["event"] == "segment_end"]
    launches = [e for e in events if e["event"] == "launch"]
    out: dict[str, Any] = {
        "first_iteration_s": ends[0]["launch_s"] if ends else None,
        "iteration_ms": 1e3 / ends[0]["throughput"] if ends and ends[0]["throughput"] else None,
        "lost_iterations": sum(e["lost_iterations"] for e in ends),
        "segments": len(ends), "configs": [e["config"] for e in ends] if ends else [],
        "within_limits": next((e["within_limits"] for e in events if e["event"] == "finish"), None),
    }
    preemptions = [e for e in events if e["event"] == "preemption"]
    if preemptions and len(ends) > 1 and ends[1]["launch_s"] is not None:
        training_again = launches[1]["elapsed_s"] + ends[1]["launch_s"]
        out["event_to_training_s"] = training_again - preemptions[0]["elapsed_s"]
        out["replan_ms"] = next(e["latency_s"] for e in events if e["event"] == "replan") * 1e3
        out["source"] = preemptions[0]["source"]
    return out


class Trigger:
    """on_progress: run `action` once in a thread at iteration `at`."""

    def __init__(self, at: int, action: Any) -> None:
        self.at, self.action, self.thread = at, action, None

    def __call__(self, snapshot: Any) -> None:
        if self.thread is None and snapshot.iterations >= self.at:
            self.thread = threading.Thread(target=self.action, daemon=True)
            self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(60)


def one_run(plan: Any, problem: Any, kind: str, provider: Any = None, trigger: Trigger | None = None,
            faults: tuple = ()) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        failure = None
        try:
            train(plan, ZOO, problem=problem, run_dir=folder, config=CONFIG, provider=provider, faults=faults,
                  on_progress=trigger)
        except TrainingError as e:  # the figures up to the failure still count; the table says it failed
            failure = f"{type(e).__name__}: {e}"
        if trigger is not None:
            trigger.join()
        result = figures(read_run_log(Path(folder) / "run.jsonl"))
        result["failure"] = failure
    console.print(f"  {kind}: {json.dumps(result)}", highlight=False)
    return result


def local_runs(plan: Any, problem: Any, repeats: int) -> dict[str, list[dict[str, Any]]]:
    console.print("[bold]local launcher[/bold] (fork server on this host)")
    return {"clean": [one_run(plan, problem, "clean") for _ in range(repeats)],
            "lost": [one_run(plan, problem, "lost", faults=(KillWorker(1, at_iteration=AT),))],
            "notice": [one_run(plan, problem, "notice", faults=(KillWorker(1, at_iteration=AT, warning_s=NOTICE_S),))]}


def ray_runs(plan: Any, problem: Any, repeats: int) -> dict[str, list[dict[str, Any]]]:
    from ray_cluster import ThreeNodes

    from thrifty.runtime.cluster.provider import RayProvider

    console.print("[bold]Ray launcher[/bold] (three Ray nodes on 127.0.0.1)")
    nodes = ThreeNodes()
    catalog = load_catalog(CATALOG)

    def provider() -> RayProvider:
        nodes.refill()
        return RayProvider("bench", catalog, nodes.cluster.address, imds_interval_s=0.2, preload=WORKER_PRELOAD)

    def notice_then_remove() -> None:
        nodes.imds["spare"].interrupt(in_s=NOTICE_S)
        time.sleep(NOTICE_S)
        nodes.remove_spare()

    out: dict[str, list[dict[str, Any]]] = {"clean": [], "lost": [], "notice": []}
    try:
        for kind, action in [("clean", None)] * repeats + [("lost", nodes.remove_spare),
                                                           ("notice", notice_then_remove)]:
            with provider() as p:
                out[kind].append(one_run(plan, problem, kind, p, Trigger(AT, action) if action else None))
    finally:
        nodes.close()
    return out


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt(value: float | None, unit: str, scale: float = 1.0, digits: int = 2) -> str:
    return "--" if value is None else f"{value * scale:.{digits}f} {unit}"


def table(local: dict[str, list[dict[str, Any]]], ray: dict[str, list[dict[str, Any]]]) -> Table:
    t = Table(title="a plan on a Ray cluster against the local launcher (same plan, this host)")
    for column in ("figure", "local launcher", "Ray launcher", "Ray / local", "target"):
        t.add_column(column)

    def row(name: str, kind: str, key: str, unit: str, target: str = "-", digits: int = 2) -> None:
        a, b = median(local[kind], key), median(ray[kind], key)
        ratio = "--" if a in (None, 0) or b is None else f"{b / a:.3f}"
        t.add_row(name, fmt(a, unit, digits=digits), fmt(b, unit, digits=digits), ratio, target)

    row("machines ready -> first iteration", "clean", "first_iteration_s", "s")
    row("iteration time (steady state, workers' clock)", "clean", "iteration_ms", "ms", "Ray <= 1.05 x local")
    row("re-plan latency (solve)", "lost", "replan_ms", "ms", "<= 1000 ms", 1)
    row("node lost: event -> training again", "lost", "event_to_training_s", "s")
    row("spot notice: event -> training again", "notice", "event_to_training_s", "s")
    row("iterations lost, no notice", "lost", "lost_iterations", "", "< checkpoint interval (50)", 0)
    row("iterations lost, 10 s notice", "notice", "lost_iterations", "", "0", 0)
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="clean runs per launcher")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    args = parser.parse_args()
    # the miniature's plan, with room in the time limit: on a busy 2-core host the tiny transformer runs
    # slower than its profile says, and a re-plan that finds no plan would end a run before its figures
    problem = load_problem(DEMO)
    plan = solve(problem)
    problem = problem.model_copy(update={"limits": problem.limits.model_copy(update={"time_s": 300.0})})
    one, five, _ = os.getloadavg()
    console.print(f"plan {plan.config}; host load average {one:.1f} (1 min), {five:.1f} (5 min) on "
                  f"{os.cpu_count()} CPUs")
    local = local_runs(plan, problem, args.repeats)
    ray = ray_runs(plan, problem, args.repeats)
    console.print(table(local, ray))
    if args.json:
        args.json.write_text(json.dumps({"local": local, "ray": ray}, indent=1))


if __name__ == "__main__":
    main()
