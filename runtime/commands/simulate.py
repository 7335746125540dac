"""``thrifty simulate``: predict one training iteration on a cluster configuration."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from thrifty.runtime.commands._args import with_exit_codes

HELP = "predict one training iteration (mean, p95, breakdown) on a mix of machines and batches"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: ""})
    parser.add_argument("--model", required=True,
                        help="a shipped model name (e.g. resnet50) or a profile / compute-model JSON file")
    parser.add_argument("--config", required=True,
                        help="machines and per-machine batches, e.g. '4xp3.8xlarge@512+4xg4dn.8xlarge@32' "
                             "or 'local@16+local@48'")
    parser.add_argument("--allreduce", metavar="MODEL.json",
                        help="a learned allreduce model (thrifty fit-allreduce); default: the shipped "
                             "local gloo model for 'local', the analytic ring model for other types")
    parser.add_argument("--catalog", metavar="CATALOG.json", help="instance catalog (default: shipped AWS)")
    parser.add_argument("--apm", action="store_true", help="also show the APM baseline's prediction")
    parser.add_argument("--transfer", choices=("ddp", "layer"), default="ddp",
                        help="transfer units: DDP gradient buckets (default) or one per layer (Srifty)")
    parser.add_argument("--samples", type=int, default=256, help="sampled iterations (default 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print only the prediction as JSON")


def run(args: argparse.Namespace) -> int:
    from thrifty.datasets.catalog import load_catalog
    from thrifty.perfmodels.cluster import format_cluster, parse_cluster
    from thrifty.perfmodels.library import ModelLibrary
    from thrifty.perfmodels.loading import default_bandwidth_model, load_bandwidth_model
    from thrifty.perfmodels.simulator import IterationSimulator

    catalog = load_catalog(args.catalog)
    groups = parse_cluster(args.config, catalog)
    library = ModelLibrary()
    model = args.model
    if model.endswith(".json") or Path(model).exists():
        model = library.add_file(model).model
    bandwidth = load_bandwidth_model(args.allreduce) if args.allreduce else default_bandwidth_model()
    sim = IterationSimulator(model, library=library, bandwidth=bandwidth, samples=args.samples,
                             seed=args.seed, transfer=args.transfer)
    prediction = sim.simulate(groups)
    apm = None
    if args.apm:
        from thrifty.perfmodels.apm import ApmSimulator

        apm = ApmSimulator(model, library=library, bandwidth=bandwidth).simulate(groups)
    global_batch = sum(g.count * g.batch for g in groups)
    sources = {g.instance_type.name: sim.sources(g.instance_type) for g in groups}
    if args.json:
        out = {"model": model, "config": format_cluster(groups), "global_batch": global_batch,
               "prediction": prediction.to_json(),
               "provenance": {name: {"compute": s.compute.model_dump(), "allreduce": s.allreduce.model_dump()}
                              for name, s in sources.items()}}
        if apm is not None:
            out["apm"] = apm.to_json()
        print(json.dumps(out, indent=1))
        return 0
    _print_human(model, format_cluster(groups), global_batch, prediction, apm, sources)
    return 0


def _print_human(model, config, global_batch, p, apm, sources) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"{model} on {config}  (global batch {global_batch}, {p.world_size} workers "
                        f"on {p.instances} machines)")
    table.add_column("")
    table.add_column("thrifty", justify="right")
    if apm is not None:
        table.add_column("APM", justify="right")
    rows = [("iteration mean", "mean_s"), ("iteration p95", "p95_s"), ("iteration sd", "sd_s"),
            ("forward", "forward_s"), ("backward", "backward_s"),
            ("parameter exchange (from backward start)", "exchange_s"),
            ("exposed communication", "exposed_comm_s"), ("optimizer step", "step_s")]
    for label, key in rows:
        cells = [label, _ms(getattr(p, key))]
        if apm is not None:
            cells.append(_ms(getattr(apm, key)))
        table.add_row(*cells)
    cells = ["throughput", f"{global_batch / p.mean_s:,.1f} samples/s"]
    if apm is not None:
        cells.append(f"{global_batch / apm.mean_s:,.1f} samples/s")
    table.add_row(*cells)
    console.print(table)
    said = ", ".join(f"{k}: {v}" for k, v in p.bandwidth_sources.items())
    console.print(f"allreduce model: {said}")
    for name, s in sources.items():
        for what, source in (("compute", s.compute), ("allreduce", s.allreduce)):
            console.print(f"  {name} {what}: {source.describe()}", markup=False, highlight=False, soft_wrap=True,
                          style="bold" if source.fallback else None)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.2f} ms"
