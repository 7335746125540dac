"""``thrifty profile-scaling JOB --world-sizes 1,2,4 --batch 64
--out PROFILE.json``: measure a RubberBand scaling profile (4.1) on this
host, one real ``torch.distributed`` world per world size, and write it
atomically as ``thrifty.scaling_profile/1``.

JOB (``package.module:function``) is resolved once
(`thrifty.runtime.measure.resolve_target`): a job (a loop function
``train(ctx, **args)``, or a factory of the four-factory `Trainer`;
``--job-args JSON`` its keyword arguments) is timed running its own loop in
the rank loop of ``thrifty run`` at each world size, the batch split evenly
(`thrifty.runtime.measure.job_truth`: per iteration the slowest rank's whole
iteration, from report to report, data and all); a `Workload` factory
(``(model, make_batch, loss_fn)``) as one DDP training step of its model,
the ranks meeting at a barrier before each
(`thrifty.runtime.measure.scaling_profiler`).

The provenance of the written file records this command with every setting
spelled out, so re-running that line reproduces the measurement.

``--cluster CLUSTER --instance-types A,B,C [--market spot]`` measures it on
machines of each type taken from the cluster: as many as the largest world
needs (``ceil(W / gpus)``, rank r on machine ``r // gpus``), given back after
the type's worlds. The bundle it writes (`thrifty.perfmodels.bundle`) holds
each type's scaling profile and its SCALE and INIT latencies (asking for the
machines until the provider hands them over; from then until a rank runs on
each), which a tuning problem whose ``model`` names the bundle uses where
its ``cloud`` does not state them; the command prints them, and the cost.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from thrifty.core.errors import ProblemError

from thrifty.runtime.commands._args import int_at_least, output_file, positive_float, with_exit_codes
from thrifty.runtime.commands._on_cluster import add_cluster_arguments, check_cluster_arguments

HELP = "measure how one trial's iteration latency scales with its workers (a RubberBand scaling profile) here"

__all__ = ["HELP", "add_arguments", "run", "parse_world_sizes", "command_line"]


def parse_world_sizes(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; anything but integers separated by commas is a `ProblemError`."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ProblemError(f"--world-sizes is '{text}', but must be integers >= 1 separated by commas") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: "the profile was written",
                             1: "a worker or measurement failed, or the cluster gave no machine"})
    parser.add_argument("factory", metavar="JOB",
                        help="a job (a loop function train(ctx, ...), or a Trainer factory) or a Workload factory, "
                             "as package.module:function, e.g. thrifty.runtime.training.examples:mlp_loop")
    parser.add_argument("--job-args", metavar="JSON", help="the job's keyword arguments, a JSON object")
    parser.add_argument("--world-sizes", required=True, metavar="1,2,4", help="worker counts to time (must include 1)")
    parser.add_argument("--batch", required=True, type=int, metavar="N",
                        help="the trial's batch, split evenly over the workers")
    parser.add_argument("--out", required=True, type=output_file, metavar="PROFILE.json",
                        help="where to write the scaling profile")
    parser.add_argument("--name", help="the model name in the profile (default: the factory's name, '_' as '-')")
    parser.add_argument("--instance-type", default="local",
                        help="the instance type the profile describes (default local)")
    parser.add_argument("--iterations", type=int_at_least(1), default=20,
                        help="timed iterations per world size (default 20)")
    parser.add_argument("--warmup", type=int_at_least(0), default=3, help="untimed iterations before them (default 3)")
    parser.add_argument("--threads", type=int_at_least(1), default=1, help="torch threads per worker (default 1)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where to run (default auto)")
    parser.add_argument(
        "--timeout", type=positive_float, default=300.0, metavar="S",
        help="bound on every collective, and on a world that finishes no iteration for S seconds (default 300)",
    )
    parser.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    add_cluster_arguments(parser, "the scaling profile")


def command_line(args: argparse.Namespace, sizes: list[int], name: str) -> str:
    """The command that reproduces this measurement, every data setting spelled out."""
    words = ["thrifty", "profile-scaling", args.factory]
    if args.job_args is not None:
        words += ["--job-args", args.job_args]
    words += ["--world-sizes", ",".join(map(str, sizes))]
    words += ["--batch", str(args.batch), "--out", args.out, "--name", name]
    if args.cluster is None:
        words += ["--instance-type", args.instance_type]
    words += ["--iterations", str(args.iterations), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    if args.cluster is None:
        words += ["--device", args.device]
    words += ["--timeout", f"{args.timeout:g}"]
    if args.cluster is not None:
        words += ["--cluster", args.cluster, "--instance-types", args.instance_types,
                  "--market", args.market or "on_demand"]
        if args.catalog is not None:
            words += ["--catalog", args.catalog]
    return shlex.join(words)


def run(args: argparse.Namespace) -> int:
    from thrifty.core.io import write_json
    from thrifty.core.validation import validate_model
    from thrifty.perfmodels.scaling import ScalingProfileFile
    from thrifty.runtime.commands.profile import parse_job_args
    from thrifty.runtime.measure import check_world_sizes, default_model_name, profile_scaling, resolve_target

    check_cluster_arguments(args)
    sizes = check_world_sizes(
        parse_world_sizes(args.world_sizes), args.batch, sizes_name="--world-sizes", batch_name="--batch"
    )
    name = args.name or default_model_name(args.factory)
    # a bad job or factory is a clear error here, before any process or machine is started
    target = resolve_target(args.factory, parse_job_args(args.job_args))
    if args.job_args is not None and not target.is_job:
        raise ProblemError(f"--job-args: '{args.factory}' is a Workload factory, which the worker processes call "
                           "without arguments")
    job_args = target.args if target.is_job else None
    if args.cluster is not None:
        return _run_on_cluster(args, sizes, name, job_args)

    def measure(on_progress: Any) -> dict[str, Any]:
        return profile_scaling(
            args.factory,
            sizes,
            args.batch,
            iterations=args.iterations,
            warmup=args.warmup,
            device=args.device,
            threads=args.threads,
            timeout_s=args.timeout,
            model_name=name,
            instance_type=args.instance_type,
            command=command_line(args, sizes, name),
            on_progress=on_progress,
            job_args=job_args,
        )

    document = measure(None) if args.no_progress else _with_bar(measure)
    # never write a file that does not load (built here: lax about tuples)
    profile = validate_model(ScalingProfileFile, document, source=args.out, strict=False)
    write_json(args.out, profile.to_json())
    _print_summary(document, args.out)
    return 0


def _run_on_cluster(args: argparse.Namespace, sizes: list[int], name: str, job_args: Any) -> int:
    """Each type on its own machines: its worlds, the machines given back; one bundle, latencies and cost."""
    from thrifty.datasets.catalog import load_catalog
    from thrifty.runtime.commands._on_cluster import (measure_types, parse_instance_types, placement_on,
                                                      print_costs, say_on_stderr, write_bundle)
    from thrifty.runtime.measure import REMOTE_PRELOAD, profile_scaling

    if args.device != "auto" or args.instance_type != "local":
        raise ProblemError("--device and --instance-type come from --instance-types with --cluster; leave them out")
    catalog = load_catalog(args.catalog)
    types = parse_instance_types(args.instance_types, catalog)
    market = args.market or "on_demand"
    command = command_line(args, sizes, name)

    def machines_of(itype: Any) -> int:
        return -(-sizes[-1] // itype.gpus)

    def measure(itype: Any, provider: Any, machines: list[Any]) -> dict[str, Any]:
        return profile_scaling(
            args.factory, sizes, args.batch, iterations=args.iterations, warmup=args.warmup,
            device="cpu" if itype.device == "cpu" else "cuda", threads=args.threads, timeout_s=args.timeout,
            model_name=name, instance_type=itype.name, command=command,
            placement=placement_on(provider, machines, itype.gpus, REMOTE_PRELOAD), job_args=job_args)

    say = (lambda _line: None) if args.no_progress else say_on_stderr
    profiles, costs = measure_types(args.cluster, catalog, types, market, machines_of, measure, args.timeout, say)
    write_bundle(args.out, "scaling", name, args.cluster, market, command, profiles, costs)
    for document in profiles.values():
        _print_summary(document, args.out, wrote=False)
    print_costs(costs, market, args.out)
    for c in costs:
        print(f"{c.instance_type}: \"cloud\": {{\"scale_latency_s\": {c.scale_latency_s:.2f}, "
              f"\"init_latency_s\": {c.init_latency_s:.2f}}} (a tuning problem naming {args.out} as its model "
              "uses these unless its cloud states them)")
    return 0


def _with_bar(measure: Any) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("scaling profile", total=None)

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=f"scaling profile, {label}")

        return measure(update)


def _print_summary(document: dict[str, Any], out: str, wrote: bool = True) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{document['model']}, batch {document['batch']}, on {document['instance_type']}")
    for column in ("workers", "iteration ms", "sd ms", "speed-up"):
        table.add_column(column, justify="right")
    base = document["points"][0]["iteration_s"]
    for p in document["points"]:
        table.add_row(
            str(p["gpus"]), f"{p['iteration_s'] * 1e3:.3f}", f"{p['iteration_sd_s'] * 1e3:.3f}",
            f"{base / p['iteration_s']:.2f}",
        )
    console = Console()
    console.print(table)
    console.print(f"start-up {document['startup_s']:.2f} s" + (f"; wrote {out}" if wrote else ""))
