"""Issue 15's guard: a refactor must not make thrifty slower. Measures, side
by side on this host, two checkouts of thrifty (each with its own virtual
environment): re-plan latency, tuning relaunch time and simulator speed.

Each figure comes from a fresh process of the checkout's own Python, and the
two checkouts alternate round by round (A B B A A B ...), so that a drift in
the load of the host hits both alike. Medians over rounds; a ratio above 1.05
is a regression of more than 5%.

- re-plan latency: `Replanner.replan` after a spot machine is lost, Srifty 5.4
  at paper scale (``benchmarks/runtime_overheads.py``'s setting), the first
  re-plan of a re-planner whose search space was built at run start, median
  of 5 per process;
- tuning relaunch: `WorldExecutor`, one trial suspended after each iteration
  and relaunched from its checkpoint, alternately on 1 and 2 ranks; the time
  from a launch to the start of its first iteration (processes, process
  group, restore), median of 6 relaunches per process (the first launch,
  which starts the fork server, is left out);
- iteration simulator: `IterationSimulator.simulate` on 24 mixed clusters of
  the shipped ResNet-50 profiles, a fresh simulator each pass (no cache),
  simulations per second;
- job simulator: `JobSimulator.simulate` of a 3-stage plan, 64 samples,
  simulations per second.

Run: ``python benchmarks/before_after.py --before /path/to/old/.venv/bin/python
--after .venv/bin/python --rounds 5`` (each Python imports its own thrifty).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEASURES = ("replan", "relaunch", "iteration_sim", "job_sim")
UNITS = {"replan": ("ms", True), "relaunch": ("s", True), "iteration_sim": ("sims/s", False),
         "job_sim": ("sims/s", False)}


# -- the measurements (run inside the checkout under test) -----------------------------------

def measure_replan() -> float:
    from thrifty.runtime.training.replan import Replanner

    sys.path.insert(0, str(_repo() / "benchmarks"))
    from runtime_overheads import srifty54_problem  # the checkout's own copy of the setting

    problem = srifty54_problem()
    key = ("p3.8xlarge", "spot")
    times = []
    for _ in range(5):  # a run's first re-plan: a fresh re-planner, its space built at run start (not timed)
        replanner = Replanner(problem)
        _ = replanner.space
        replanner.deplete(key)
        replan = replanner.replan("preemption", old_plan=None, remaining_iterations=200, elapsed_s=223.0,
                                  spent_usd=1.0, survivors={key: 1}, launch_s=155.0, event_at=time.time())
        times.append(replan.latency_s)
    return statistics.median(times) * 1e3


def measure_relaunch() -> float:
    from thrifty.runtime.tuning.executors.worlds import WorldExecutor
    from thrifty.runtime.tuning.trial import Report, Trial

    with tempfile.TemporaryDirectory() as folder, \
            WorldExecutor("thrifty.runtime.tuning.executors.worlds:example_trainer", folder,
                          start_timeout_s=120, iteration_timeout_s=120) as executor:
        trial = Trial(0, {"lr": 0.1, "samples": 256})
        for launch in range(7):
            executor.launch(trial, 1 + launch % 2)
            event = executor.next_event(None)
            if not isinstance(event, Report):
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


def _repo() -> Path:
    """The repository of the thrifty this Python imports."""
    import thrifty.solver

    return Path(thrifty.solver.__file__).resolve().parent.parent


# -- the comparison (run by the user) ------------------------------------------------------

def run_one(python: str, measure: str) -> float:
    out = subprocess.run([python, __file__, "--measure", measure], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{python} --measure {measure} failed:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["value"])


def compare(before: str, after: str, rounds: int, measures: list[str]) -> dict[str, dict[str, list[float]]]:
    values: dict[str, dict[str, list[float]]] = {m: {"before": [], "after": []} for m in measures}
    for r in range(rounds):
        order = [("before", before), ("after", after)] if r % 2 == 0 else [("after", after), ("before", before)]
        for measure in measures:
            for name, python in order:
                values[measure][name].append(run_one(python, measure))
                print(f"round {r + 1}/{rounds} {measure} {name}: {values[measure][name][-1]:.4g}", file=sys.stderr)
    return values


def table(values: dict[str, dict[str, list[float]]]) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Table(title="before / after, same host, interleaved (medians; ratio > 1 is slower)")
    for col in ("measure", "before", "after", "after/before (time)", "verdict"):
        out.add_column(col, justify="right" if col != "measure" else "left")
    for measure, pair in values.items():
        unit, lower_better = UNITS[measure]
        b, a = statistics.median(pair["before"]), statistics.median(pair["after"])
        ratio = a / b if lower_better else b / a  # as a time ratio either way
        out.add_row(measure, f"{b:.4g} {unit}", f"{a:.4g} {unit}", f"{ratio:.3f}",
                    "ok" if ratio <= 1.05 else "REGRESSION")
    Console(width=160).print(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", choices=MEASURES, help="(internal) print one figure of this checkout as JSON")
    parser.add_argument("--before", help="the Python of the old checkout's environment")
    parser.add_argument("--after", default=sys.executable, help="the Python of the new checkout's environment")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default=",".join(MEASURES), help="comma-separated measures")
    parser.add_argument("--json", type=Path, help="also write the raw values here")
    args = parser.parse_args()
    if args.measure:
        print(json.dumps({"measure": args.measure, "value": globals()[f"measure_{args.measure}"]()}))
        return
    if not args.before:
        parser.error("give --before PYTHON (and --after PYTHON)")
    values = compare(args.before, args.after, args.rounds, args.only.split(","))
    if args.json:
        args.json.write_text(json.dumps(values, indent=1))
    table(values)


if __name__ == "__main__":
    main()
