"""Issue 15's guard: a refactor must not make thrifty slower. Measures, side
by side on this host, two checkouts of thrifty (each with its own virtual
environment): re-plan latency, tuning relaunch time, simulator speed, and
iteration time under the local and the Ray launchers.

Each figure comes from a fresh process of the checkout's own Python, and the
two checkouts alternate round by round (A B B A A B ...), so that a drift in
the load of the host hits both alike. Medians over rounds; a ratio above 1.05
is a regression of more than 5%.

- re-plan latency: `Replanner.replan` after a spot machine is lost, Srifty 5.4
  at paper scale (``benchmarks/runtime_overheads.py``'s setting), the first
  re-plan of a re-planner whose search space was built at run start, median
  of 5 per process;
- tuning relaunch: the executor of trials in worker worlds (`WorldExecutor`;
  `LocalExecutor` before issue 34), one trial suspended after each iteration
  and relaunched from its checkpoint, alternately on 1 and 2 ranks; the time
  from a launch to the start of its first iteration (processes, process
  group, restore), median of 6 relaunches per process (the first launch,
  which starts the fork server, is left out);
- iteration simulator: `IterationSimulator.simulate` on 24 mixed clusters of
  the shipped ResNet-50 profiles, a fresh simulator each pass (no cache),
  simulations per second;
- job simulator: `JobSimulator.simulate` of a 3-stage plan, 64 samples,
  simulations per second;
- iteration time, local launcher: `train` of the Srifty 5.4 miniature's plan
  (``datasets/examples/local-demo-srifty54.json``: two local-a spot machines,
  32 examples each, the tiny transformer of the zoo) on this host's local
  worker slots (one fork server), no re-plan and no checkpoint but the last;
  the steady-state iteration time from the workers' clock (the world's
  reported throughput), milliseconds;
- iteration time, Ray launcher: the same run on a two-node Ray cluster this
  process starts on this host (every node bound to 127.0.0.1, each a local-a
  spot machine), reached through ``train(..., cluster=ADDRESS)``.

Names the refactor moves are looked up at their new home first, then at the
old one (`resolve`), so the one script measures both checkouts.

Run: ``python benchmarks/before_after.py --before /path/to/old/.venv/bin/python
--after .venv/bin/python [--rounds 3] [--only replan,iteration_ray] [--json FILE]``
(each Python imports its own thrifty; the table names the folder and commit of
each, and the host's load average while the figures were taken).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MEASURES = ("replan", "relaunch", "iteration_sim", "job_sim", "iteration_local", "iteration_ray")
UNITS = {"replan": ("ms", True), "relaunch": ("s", True), "iteration_sim": ("sims/s", False),
         "job_sim": ("sims/s", False), "iteration_local": ("ms", True), "iteration_ray": ("ms", True)}
ITERATIONS = 200  # of the training runs: the timed steady state is all but the first few


# -- the measurements (run inside the checkout under test) -----------------------------------

def measure_replan() -> float:
    replanner_class = resolve("thrifty.runtime.training.replan:Replanner")

    sys.path.insert(0, str(_repo() / "benchmarks"))
    from runtime_overheads import srifty54_problem  # the checkout's own copy of the setting

    problem = srifty54_problem()
    key = ("p3.8xlarge", "spot")
    times = []
    for _ in range(5):  # a run's first re-plan: a fresh re-planner, its space built at run start (not timed)
        replanner = replanner_class(problem)
        _ = replanner.space
        replanner.deplete(key)
        replan = replanner.replan("preemption", old_plan=None, remaining_iterations=200, elapsed_s=223.0,
                                  spent_usd=1.0, survivors={key: 1}, launch_s=155.0, event_at=time.time())
        times.append(replan.latency_s)
    return statistics.median(times) * 1e3


# the executor of tuning trials in worker worlds, at its homes new to old (issue 34 renames LocalExecutor)
TRIAL_EXECUTORS = ("thrifty.runtime.tuning.executors.worlds:WorldExecutor",
                   "thrifty.runtime.tuning.executors.world:WorldExecutor",
                   "thrifty.runtime.tuning.executors.local:WorldExecutor",
                   "thrifty.runtime.tuning.executors:WorldExecutor",
                   "thrifty.runtime.tuning.executors.local:LocalExecutor",
                   "thrifty.runtime.tuning.executor_local:LocalExecutor")
EXAMPLE_TRAINERS = ("thrifty.runtime.tuning.executors.worlds:example_trainer",
                    "thrifty.runtime.tuning.executors.world:example_trainer",
                    "thrifty.runtime.tuning.executors.local:example_trainer",
                    "thrifty.runtime.tuning.examples:example_trainer",
                    "thrifty.runtime.tuning.executor_local:example_trainer")


def measure_relaunch() -> float:
    executor_class = resolve(*TRIAL_EXECUTORS)
    trainer = resolved_name(*EXAMPLE_TRAINERS)
    report_class = resolve("thrifty.runtime.tuning.trial:Report")
    trial_class = resolve("thrifty.runtime.tuning.trial:Trial")

    with tempfile.TemporaryDirectory() as folder, \
            executor_class(trainer, folder, start_timeout_s=120, iteration_timeout_s=120) as executor:
        trial = trial_class(0, {"lr": 0.1, "samples": 256})
        for launch in range(7):
            executor.launch(trial, 1 + launch % 2)
            event = executor.next_event(None)
            if not isinstance(event, report_class):
                raise RuntimeError(f"the trial did not report: {event}")
            trial.checkpoint = executor.suspend(trial)
        starts = [r.startup_s for r in executor.launches[1:]]
    return statistics.median(starts)


def measure_iteration_sim() -> float:
    from thrifty.datasets.catalog import load_catalog
    from thrifty.perfmodels.cluster import parse_cluster
    from thrifty.perfmodels.simulator import IterationSimulator

    catalog = load_catalog(_repo() / "datasets" / "catalog" / "srifty-2022.json")
    configs = [f"{a}xp3.8xlarge@{b}+{c}xg4dn.8xlarge@{d}" for a in (1, 2) for b in (256, 512)
               for c in (2, 4, 8) for d in (32, 64)]
    groups = [parse_cluster(text, catalog) for text in configs]
    IterationSimulator("resnet50").simulate(groups[0])  # loads the library: not timed
    rates = []
    for _ in range(5):
        sim = IterationSimulator("resnet50")
        start = time.perf_counter()
        for g in groups:
            sim.simulate(g)
        rates.append(len(groups) / (time.perf_counter() - start))
    return statistics.median(rates)


def measure_job_sim() -> float:
    from thrifty.perfmodels.experiment import ExperimentSpec
    from thrifty.perfmodels.jobsim import JobSimulator, StageAllocation
    from thrifty.perfmodels.scaling import CloudProfile, ScalingProfile

    spec = ExperimentSpec.explicit([(16, 2), (8, 4), (4, 8)])
    profile = ScalingProfile("toy", "box", (1, 2, 4), (10.0, 6.0, 4.0), (1.0, 0.8, 0.6))
    cloud = CloudProfile("box", 4, 12.0, "per_instance", 60.0, scale_latency_s=10, init_latency_s=5,
                         init_latency_sd_s=1.0)
    plan = (StageAllocation(1, 4), StageAllocation(2, 4), StageAllocation(4, 4))
    sim = JobSimulator(spec, {"box": profile}, {"box": cloud}, samples=64, seed=1)
    sim.simulate(plan)
    rates = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20):
            sim.simulate(plan)
        rates.append(20 / (time.perf_counter() - start))
    return statistics.median(rates)


def training_run(folder: str, cluster: str | None = None) -> float:
    """The steady-state iteration time (ms, the workers' clock) of the Srifty
    5.4 miniature's plan, `ITERATIONS` long, with room in its limits (no
    re-plan on a busy host), on `cluster` (None: this host's local slots)."""
    solve = resolve("thrifty.solver:solve")
    train = resolve("thrifty.runtime.training:train")
    run_config = resolve("thrifty.runtime.training:RunConfig")

    demo = _repo() / "datasets" / "examples" / "local-demo-srifty54.json"
    problem = {**json.loads(demo.read_text()), "catalog": str(demo.parent / "local-demo-catalog.json")}
    plan = solve(problem)
    problem.update(iterations=ITERATIONS, limits={"time_s": 3600.0, "cost_usd": 100.0})
    config = run_config(checkpoint_every=None, checkpoint_every_s=None, replan_on_slowdown=False,
                        world_timeout_s=300, stall_timeout_s=300, stop_timeout_s=120)
    trainer = resolved_name("thrifty.runtime.training.examples:zoo")
    result = train(plan, trainer, problem=problem, run_dir=folder, config=config, cluster=cluster)
    [segment] = result.segments  # one world, the plan's, from start to end: its throughput is the figure
    if segment.ended != "finished" or not segment.throughput:
        raise RuntimeError(f"the run did not finish in one world: {result.segments}")
    return 1e3 / segment.throughput


def measure_iteration_local() -> float:
    with tempfile.TemporaryDirectory() as folder:
        return training_run(folder)


def measure_iteration_ray() -> float:
    """`training_run` on two Ray nodes of this host, each a local-a spot machine (one CPU)."""
    import ray
    from ray.cluster_utils import Cluster

    try:  # a cluster bound to 127.0.0.1 stays there (what thrifty's `connect` does for a loopback address)
        resolve("thrifty.runtime.cluster.connect:keep_loopback", "thrifty.runtime.worlds.ray:keep_loopback")()
    except LookupError:
        from ray._private import services

        services.resolve_ip_for_localhost = lambda host: host
    node = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "object_store_memory": 80 * 2**20,
            "resources": {"thrifty-type:local-a": 1, "thrifty-market:spot": 1}}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        with tempfile.TemporaryDirectory() as folder:
            return training_run(folder, cluster.address)
    finally:
        ray.shutdown()
        cluster.shutdown()


def resolve(*names: str) -> Any:
    """The first of `names` (``MODULE:ATTRIBUTE``) this checkout has: a name
    issue 34 moves is found at its new home in the new checkout and at its
    old one in the old. `LookupError` naming them all when none is here."""
    return _find(names)[1]


def resolved_name(*names: str) -> str:
    """Which of `names` (``MODULE:ATTRIBUTE``) this checkout has: for what is passed by name (a trainer)."""
    return _find(names)[0]


def _find(names: tuple[str, ...]) -> tuple[str, Any]:
    for name in names:
        module_name, _, attribute = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:  # this checkout has no such module; a missing dependency is an error
            if e.name and e.name.startswith("thrifty.") and (module_name + ".").startswith(e.name + "."):
                continue
            raise
        if hasattr(module, attribute):
            return name, getattr(module, attribute)
    raise LookupError(f"this checkout of thrifty has none of {', '.join(names)}")


def _repo() -> Path:
    """The repository of the thrifty this Python imports."""
    import thrifty.solver

    return Path(thrifty.solver.__file__).resolve().parent.parent


# -- the comparison (run by the user) ------------------------------------------------------

def run_one(python: str, *argv: str) -> Any:
    """What this script, run by `python` with `argv`, prints last (JSON)."""
    out = subprocess.run([python, __file__, *argv], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{python} {' '.join(argv)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def where() -> dict[str, str]:
    """The repository of the thrifty this Python imports, and its commit."""
    repo = _repo()
    head = subprocess.run(["git", "-C", str(repo), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return {"repo": str(repo), "commit": head.stdout.strip()[:72] or "(not a git checkout)"}


def compare(before: str, after: str, rounds: int, measures: list[str]) -> dict[str, Any]:
    """Every measure of both checkouts, `rounds` times, the two alternating
    (A B, then B A, ...); each value with the host's 1-minute load average
    when its process started."""
    values: dict[str, Any] = {m: {"before": [], "after": [], "load": []} for m in measures}
    for r in range(rounds):
        order = [("before", before), ("after", after)] if r % 2 == 0 else [("after", after), ("before", before)]
        for measure in measures:
            for name, python in order:
                values[measure]["load"].append(os.getloadavg()[0])
                values[measure][name].append(float(run_one(python, "--measure", measure)["value"]))
                print(f"round {r + 1}/{rounds} {measure} {name}: {values[measure][name][-1]:.4g} "
                      f"(load {values[measure]['load'][-1]:.1f})", file=sys.stderr)
    return values


def table(values: dict[str, Any], checkouts: dict[str, dict[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    for name, at in checkouts.items():
        console.print(f"{name}: {at['repo']} at {at['commit']}", highlight=False)
    out = Table(title=f"before / after, same host ({os.cpu_count()} CPUs), interleaved (medians, min-max; "
                      "ratio > 1 is slower)")
    for col in ("measure", "before", "after", "after/before (time)", "verdict", "load (1 min)"):
        out.add_column(col, justify="right" if col != "measure" else "left")
    for measure, pair in values.items():
        unit, lower_better = UNITS[measure]
        b, a = statistics.median(pair["before"]), statistics.median(pair["after"])
        ratio = a / b if lower_better else b / a  # as a time ratio either way
        out.add_row(measure, f"{b:.4g} {unit} ({min(pair['before']):.4g}-{max(pair['before']):.4g})",
                    f"{a:.4g} {unit} ({min(pair['after']):.4g}-{max(pair['after']):.4g})", f"{ratio:.3f}",
                    "ok" if ratio <= 1.05 else "REGRESSION", f"{min(pair['load']):.1f}-{max(pair['load']):.1f}")
    console.print(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", choices=MEASURES, help="(internal) print one figure of this checkout as JSON")
    parser.add_argument("--where", action="store_true", help="(internal) print this checkout's folder and commit")
    parser.add_argument("--before", help="the Python of the old checkout's environment")
    parser.add_argument("--after", default=sys.executable, help="the Python of the new checkout's environment")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(MEASURES), help="comma-separated measures")
    parser.add_argument("--json", type=Path, help="also write the raw values here")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps({"measure": args.measure, "value": globals()[f"measure_{args.measure}"]()}))
        return
    if args.where:
        print(json.dumps(where()))
        return
    if not args.before:
        parser.error("give --before PYTHON (and --after PYTHON)")
    measures = args.only.split(",")
    if unknown := [m for m in measures if m not in MEASURES]:
        parser.error(f"--only: {', '.join(unknown)} is not a measure; the measures are {', '.join(MEASURES)}")
    if args.rounds < 1:
        parser.error(f"--rounds is {args.rounds}, but must be at least 1")
    checkouts = {"before": run_one(args.before, "--where"), "after": run_one(args.after, "--where")}
    values = compare(args.before, args.after, args.rounds, measures)
    if args.json:
        args.json.write_text(json.dumps({"checkouts": checkouts, "values": values}, indent=1))
    table(values, checkouts)


if __name__ == "__main__":
    main()
