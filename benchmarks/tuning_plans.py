"""RubberBand's simulated experiments (EuroSys 2021, 6.1 and 6.3.1) with
thrifty's exact planner next to the static cluster, naive elastic and
RubberBand's greedy planner, one table per experiment:

(a) Table 2: SHA(32, 1, 50, 3), ResNet-101 (CIFAR-10 epochs), p3.8xlarge, 15 s
    scale and init latency, deadlines 20, 30, 40 min;
(b) 6.1.1 stragglers: SHA(64, 4, 508), ResNet-50 at 4 s per iteration, sd 1..10 s,
    per-instance and per-function billing, 60 min (the paper gives no deadline;
    at 20 min no plan survives sd >= 4 s: one latency draw per trial, 256
    iterations in the last stage);
(c) 6.1.3 job size: SHA(k, 4, 508), k swept, 20 min;
(d) 6.1.4 init latency: SHA(512, 4, 4096), 12 s per iteration, init latency 1, 10,
    100 s, deadlines 90..160 min;
(e) 6.1.2 data price: SHA(64, 4, 508) with ImageNet (150 GB) and CIFAR-10
    (0.15 GB) downloaded by every new instance, $0 .. $0.16 per GB;
(f) beyond RubberBand: the instance type chosen per stage from a list, and
    spot instances with a preemption rate priced into expected cost and time.

Targets: thrifty <= greedy everywhere; <= 0.6 x static at the 20-minute deadline
of (a); planning <= 2 s for the largest case (d). Run:
``python benchmarks/tuning_plans.py [--only a,b] [--samples 100]``.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from thrifty.solver.problem import parse_problem
from thrifty.solver.tuning import TuningSpace, plan_tuning

console = Console(width=160)


def problem(n, r, R, eta, deadline_s, model="resnet50", base=None, sd=None, billing="per_instance",
            scale=0.0, init=0.0, data_price=0.0, dataset_gb=0.0, samples=100, instance_type="p3.8xlarge",
            market="on_demand", preemptions_per_hour=0.0, recovery_s=0.0):
    profile = {}
    if base is not None:
        profile["base_iteration_s"] = base
    if sd is not None:
        profile["iteration_sd_s"] = sd
    return parse_problem({
        "kind": "tuning", "experiment": {"algorithm": "sha", "trials": n, "min_iters": r, "max_iters": R, "eta": eta},
        "model": model, "instance_type": instance_type, "deadline_s": deadline_s, "billing": billing,
        "market": market,
        "cloud": {"scale_latency_s": scale, "init_latency_s": init, "data_usd_per_gb": data_price,
                  "dataset_gb": dataset_gb, "preemptions_per_hour": preemptions_per_hour, "recovery_s": recovery_s},
        "profile": profile, "samples": samples})


def run(p):
    t0 = time.perf_counter()
    space = TuningSpace(p)
    res = plan_tuning(space)
    return res, time.perf_counter() - t0


def fmt(c):
    return "infeasible" if c is None else f"${c.cost:,.2f} / {c.result.jct_s / 60:.1f}m"


def shape(c):
    if c is None:
        return "-"
    types = {a.instance_type for a in c.plan}
    suffix = (lambda a: f"@{a.instance_type.removeprefix('p3.')}") if len(types) > 1 else (lambda a: "")
    return " ".join(f"{a.gpus_per_trial}x{a.instances}{suffix(a)}" for a in c.plan)


def table(title, label, rows):
    t = Table(title=title, title_justify="left")
    for col in (label, "static", "naive elastic", "greedy", "thrifty", "chosen", "thr/greedy", "thr/static",
                "thrifty plan (GPUs/trial x instances)", "plan s", "exact s"):
        left = col in (label, "thrifty plan (GPUs/trial x instances)", "chosen")
        t.add_column(col, justify="left" if left else "right")
    worst = 0.0
    for key, (res, wall) in rows:
        b, g, s = res.best, res.greedy, res.static
        rg = "-" if (b is None or g is None) else f"{b.cost / g.cost:.3f}"
        rs = "-" if (b is None or s is None) else f"{b.cost / s.cost:.3f}"
        if b is not None and g is not None:
            worst = max(worst, b.cost / g.cost)
        t.add_row(key, fmt(s), fmt(res.naive), fmt(g), fmt(b), res.chosen, rg, rs, shape(b), f"{wall:.2f}",
                  f"{res.planning_s['exact']:.2f}")
    console.print(t)
    return worst


def exp_a(samples):
    rows = []
    for minutes in (20, 30, 40):
        rows.append((f"{minutes} min", run(problem(32, 1, 50, 3, minutes * 60, "resnet101", scale=15, init=15,
                                                    samples=samples))))
    return table("(a) Table 2: SHA(32, 1, 50, 3), ResNet-101, p3.8xlarge, 15 s scale + init", "deadline", rows)


def exp_b(samples):
    rows = []
    for billing in ("per_instance", "per_function"):
        for sd in (1, 4, 7, 10):
            rows.append((f"{billing} sd {sd} s", run(problem(64, 4, 508, 2, 60 * 60, base=4.0, sd=sd,
                                                              billing=billing, samples=samples))))
    return table("(b) 6.1.1 stragglers: SHA(64, 4, 508), ResNet-50 4 s/iter, 60 min", "billing, sd", rows)


def exp_c(samples):
    rows = [(f"n={n}", run(problem(n, 4, 508, 2, 20 * 60, base=4.0, sd=0.4, samples=samples)))
            for n in (16, 32, 64, 128)]
    return table("(c) 6.1.3 job size: SHA(n, 4, 508), ResNet-50 4 s/iter, 20 min", "trials", rows)


def exp_d(samples):
    rows = []
    for init in (1, 10, 100):
        for minutes in (90, 120, 160):
            rows.append((f"init {init} s, {minutes} min",
                         run(problem(512, 4, 4096, 2, minutes * 60, "resnet50-b2048", base=12.0, sd=0.3, init=init,
                                     samples=samples))))
    return table("(d) 6.1.4 init latency: SHA(512, 4, 4096), ResNet-50 batch 2048, 12 s/iter", "init, deadline", rows)


def exp_e(samples):
    rows = []
    for name, gb in (("ImageNet 150 GB", 150.0), ("CIFAR-10 0.15 GB", 0.15)):
        for price in (0.0, 0.01, 0.04, 0.16):
            rows.append((f"{name} ${price}/GB", run(problem(64, 4, 508, 2, 20 * 60, base=4.0, sd=0.4, data_price=price,
                                                             dataset_gb=gb, samples=samples))))
    return table("(e) 6.1.2 data price: SHA(64, 4, 508), ResNet-50 4 s/iter, 20 min", "dataset, price", rows)


def exp_f(samples):
    """Beyond RubberBand: one instance type per stage from a list, and spot markets whose
    preemptions (a Poisson rate per instance-hour, each costing a relaunch and the lost
    iteration) are priced into the expected cost and time."""
    types = ["p3.2xlarge", "p3.8xlarge", "p3.16xlarge"]
    rows = []
    for minutes in (20, 30, 40):
        rows.append((f"3 types, {minutes} min", run(problem(32, 1, 50, 3, minutes * 60, "resnet101", scale=15, init=15,
                                                             samples=samples, instance_type=types))))
    for rate in (0.0, 0.5, 2.0):
        rows.append((f"spot, {rate:g} preemptions/h", run(problem(
            32, 1, 50, 3, 30 * 60, "resnet101", scale=15, init=15, samples=samples, market="spot",
            preemptions_per_hour=rate, recovery_s=30))))
    return table("(f) beyond RubberBand: SHA(32, 1, 50, 3), ResNet-101; type per stage from "
                 "p3.2x/8x/16xlarge (on demand), or p3.8xlarge spot at 30 min", "setting", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="a,b,c,d,e,f")
    parser.add_argument("--samples", type=int, default=100)
    args = parser.parse_args()
    worst = {}
    for key in args.only.split(","):
        worst[key] = {"a": exp_a, "b": exp_b, "c": exp_c, "d": exp_d, "e": exp_e, "f": exp_f}[key](args.samples)
    console.print("worst thrifty / greedy cost ratio per experiment: "
                  + ", ".join(f"({k}) {v:.3f}" for k, v in worst.items()))


if __name__ == "__main__":
    main()
