"""One tuning experiment three ways, side by side on this host (issue "thrifty tune"):
thrifty's ASHA and HyperSched through `thrifty.runtime.tune` (the same driver
as ``thrifty tune``), and Ray Tune's own ``ASHAScheduler`` through
``tune.Tuner``.

The same trainer (``thrifty.runtime.tuning.examples:digits_mlp``: the digits
MLP, one epoch an iteration, validation accuracy), the same configurations in
the same order (drawn once from ``datasets/examples/tune-digits.json``'s search
space and seed; Ray Tune gets them as a grid over their index, so it runs
exactly these), the same R, r and eta, the same number of workers (2 CPU
slots, one per trial for ASHA; HyperSched may give a trial both), and the
same deadline (thrifty: the experiment's deadline; Ray Tune:
``TuneConfig(time_budget_s=...)``). Torch uses one thread in every worker.

Figures per system:

- best metric at the deadline: the best validation accuracy any trial
  reported before the deadline;
- wall time: from the call to its return (Ray Tune's includes ``ray.init``);
- driver overhead per reported result: for consecutive results of one trial
  on one launch, the time between them less the later iteration's own
  training and evaluation time, i.e. what each result costs beyond the work
  (reporting it, the scheduler's decision, telling the worker to go on); the
  median over all such pairs. thrifty: from the driver's receipt times
  (``events.jsonl``); Ray Tune: the trainable's own clock, from the end of
  one iteration to the start of the next (``tune.report`` in between
  returns once the driver has taken the result and asked for more).
- results reported and trials started.

``python benchmarks/tune_end_to_end.py [--deadline 120] [--samples 32] [--json FILE]``
(about 3 x the deadline; nothing leaves this host).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "datasets" / "examples" / "tune-digits.json"
TRAINER = "thrifty.runtime.tuning.examples:digits_mlp"


def configurations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    from thrifty.runtime.tuning.experiment_file import build_search_space, parse_experiment

    space = build_search_space(parse_experiment(spec))
    out = []
    while (config := space.next_config()) is not None:
        out.append(config)
    return out


def gaps(rows: list[tuple[int, int, float, float]]) -> list[float]:
    """(trial, launch, time of the result, iteration seconds) -> the per-result overheads."""
    out = []
    last: dict[tuple[int, int], float] = {}
    for trial, launch, at, iteration_s in sorted(rows, key=lambda r: r[2]):
        key = (trial, launch)
        if key in last:
            out.append(at - last[key] - iteration_s)
        last[key] = at
    return out


def run_thrifty(spec: dict[str, Any], scheduler: dict[str, Any], folder: Path) -> dict[str, Any]:
    from thrifty.runtime.tuning.driver import tune
    from thrifty.runtime.tuning.record import read_events

    spec = {**spec, "scheduler": scheduler}
    start = time.perf_counter()
    result = tune(spec, out=folder / scheduler["name"])
    wall = time.perf_counter() - start
    events = read_events(folder / scheduler["name"] / "events.jsonl")
    launch: dict[int, int] = {}
    rows = []
    best = float("-inf")
    for e in events:
        if e["event"] == "launch":
            launch[e["trial"]] = launch.get(e["trial"], 0) + 1
        elif e["event"] == "result":
            rows.append((e["trial"], launch[e["trial"]], float(e["at"]), float(e["iteration_s"])))
            if e["at"] <= spec["deadline_s"]:
                best = max(best, float(e["metric"]))
    overhead = gaps(rows)
    return {"system": f"thrifty {scheduler['name']}", "best": best, "wall_s": wall, "results": len(rows),
            "trials": len(result.trials), "overhead_ms": 1000 * statistics.median(overhead) if overhead else None,
            "pairs": len(overhead)}


def _ray_trainable(config: dict[str, Any]) -> None:  # pragma: no cover - runs in a Ray worker
    import torch
    from ray import tune as ray_tune

    from thrifty.runtime.tuning.examples import digits_mlp

    torch.set_num_threads(1)
    params = config["configs"][config["index"]]
    trainer = digits_mlp(**params)
    torch.manual_seed(0)
    model = trainer.model()
    optimizer = trainer.optimizer(model.parameters())
    data = trainer.dataset()
    loader = torch.utils.data.DataLoader(data, batch_size=trainer.batch_size, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    previous_end = None
    for _ in range(config["max_iterations"]):
        begin = time.perf_counter()
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad()
            trainer.loss(model(inputs), targets).backward()
            optimizer.step()
        model.eval()
        accuracy = trainer.metric(model)
        end = time.perf_counter()
        gap = None if previous_end is None else begin - previous_end  # the previous result's round trip
        ray_tune.report({"accuracy": accuracy, "iteration_s": end - begin, "gap_s": gap, "at": time.time()})
        previous_end = end


def run_ray(spec: dict[str, Any], configs: list[dict[str, Any]], folder: Path) -> dict[str, Any]:
    import ray
    from ray import tune as ray_tune
    from ray.tune.schedulers import ASHAScheduler

    scheduler = spec["scheduler"]
    start = time.perf_counter()
    ray.init(num_cpus=spec["resources"]["atoms"], include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    try:
        began = time.time()
        asha = ASHAScheduler(time_attr="training_iteration", max_t=spec["max_iterations"],
                             grace_period=scheduler["min_iterations"], reduction_factor=scheduler["eta"])
        tuner = ray_tune.Tuner(
            ray_tune.with_resources(_ray_trainable, {"cpu": 1}),
            param_space={"index": ray_tune.grid_search(list(range(len(configs)))), "configs": configs,
                         "max_iterations": spec["max_iterations"]},
            tune_config=ray_tune.TuneConfig(metric="accuracy", mode="max", scheduler=asha, num_samples=1,
                                            time_budget_s=spec["deadline_s"], max_concurrent_trials=None),
            run_config=ray_tune.RunConfig(storage_path=str(folder / "ray"), name="asha", verbose=0))
        grid = tuner.fit()
        wall = time.perf_counter() - start
        best, results, overhead = float("-inf"), 0, []
        for r in grid:
            df = r.metrics_dataframe
            if df is None or df.empty:
                continue
            results += len(df)
            in_time = df[df["at"] - began <= spec["deadline_s"]]
            if not in_time.empty:
                best = max(best, float(in_time["accuracy"].max()))
            overhead += [float(g) for g in df["gap_s"].dropna()]
        return {"system": "Ray Tune ASHAScheduler", "best": best, "wall_s": wall, "results": results,
                "trials": len(grid), "overhead_ms": 1000 * statistics.median(overhead) if overhead else None,
                "pairs": len(overhead)}
    finally:
        ray.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deadline", type=float, default=None, help="seconds (default: the example's)")
    parser.add_argument("--samples", type=int, default=None, help="configurations (default: the example's)")
    parser.add_argument("--only", default="asha,hypersched,ray", help="which systems, comma-separated")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)

    spec = json.loads(EXPERIMENT.read_text())
    if args.deadline is not None:
        spec["deadline_s"] = args.deadline
    if args.samples is not None:
        spec["samples"] = args.samples
    configs = configurations(spec)
    hypersched = dict(spec["scheduler"])
    asha = {"name": "asha", "min_iterations": hypersched["min_iterations"], "eta": hypersched["eta"]}
    ray_spec = {**spec, "scheduler": asha}
    print(f"{len(configs)} configurations of {TRAINER}, R={spec['max_iterations']}, r={asha['min_iterations']}, "
          f"eta={asha['eta']}, {spec['resources']['atoms']} workers, deadline {spec['deadline_s']:g} s; "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in args.only.split(","):
            if name == "ray":
                row = run_ray(ray_spec, configs, folder)
            else:
                row = run_thrifty(spec, hypersched if name == "hypersched" else asha, folder)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(f"{'system':<26} {'best acc @ deadline':>20} {'wall s':>8} {'results':>8} {'trials':>7} "
          f"{'driver overhead / result':>25}")
    for r in rows:
        overhead = "-" if r["overhead_ms"] is None else f"{r['overhead_ms']:.1f} ms ({r['pairs']} pairs)"
        print(f"{r['system']:<26} {r['best']:>20.4f} {r['wall_s']:>8.1f} {r['results']:>8} {r['trials']:>7} "
              f"{overhead:>25}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
