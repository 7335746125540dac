"""``thrifty probe-allreduce --world-sizes 2,3,4 --out PROBES.csv``: run the
allreduce grid probe of Srifty 4.2 on this host (real torch.distributed
workers: gloo over 127.0.0.1 on CPU, NCCL on GPUs) and write the probe CSV
atomically.

The rows describe the catalog type given by ``--instance-type`` (default
``local``, one CPU worker process per instance); ``--device``,
``--rated-network-gbps`` and ``--gpus-per-instance`` override what the
catalog says. The CSV is the input of ``thrifty fit-allreduce``.

``--cluster`` (as ``thrifty run --cluster``: ``auto``, ``HOST:PORT``,
``ray://HOST:PORT``, or a cluster config file whose provider starts the
machines) runs the same probe across machines of ``--instance-type``: it
takes as many machines as the largest world needs (one rank per GPU,
``ceil(n / gpus)`` machines for world size ``n``), places rank ``r`` of every
world on machine ``r // gpus``, and gives the machines back at the end
(terminates them, for a config file). One command on the cluster replaces
the shipped derived model of that type by a measured one (then
``thrifty fit-allreduce``).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import statistics
import time
from collections.abc import Iterator
from typing import Any

from thrifty.core.errors import ProblemError
from thrifty.runtime.commands._args import (int_at_least, non_negative_float, output_file, positive_float,
                                            with_exit_codes)

HELP = "measure allreduce bus bandwidth on this host over a grid of world sizes, buffer sizes and concurrency"

__all__ = ["HELP", "add_arguments", "run", "parse_world_sizes", "parse_bytes", "command_line", "peak_per_world"]

_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20, "mb": 10**6,
          "g": 2**30, "gib": 2**30, "gb": 10**9}


def parse_world_sizes(text: str) -> tuple[int, ...]:
    """``"2,3,4"`` -> ``(2, 3, 4)``; each an integer >= 2."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise ProblemError(f"--world-sizes is '{text}', but must be integers >= 2 separated by commas") from None
    if not sizes or any(n < 2 for n in sizes):
        raise ProblemError(f"--world-sizes is '{text}', but must be integers >= 2 separated by commas")
    return tuple(sorted(set(sizes)))


def parse_bytes(text: str) -> int:
    """``"65536"``, ``"64KiB"``, ``"64MiB"``, ``"512M"`` (binary k/M/G; KB/MB/GB decimal) -> bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ProblemError(f"'{text}' is not a byte size (e.g. 65536, 64KiB, 64MiB, 1GiB)")
    return int(match.group(1)) * _UNITS[unit]


def _byte_size(text: str) -> int:
    try:
        return parse_bytes(text)
    except ProblemError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: "the probes were written", 1: "a worker or the cluster failed"})
    parser.add_argument("--world-sizes", required=True, metavar="2,3,4", help="world sizes to probe")
    parser.add_argument("--out", required=True, type=output_file, metavar="PROBES.csv",
                        help="where to write the probe rows")
    parser.add_argument(
        "--max-bytes", type=_byte_size, metavar="SIZE",
        help="largest buffer (e.g. 64MiB; default 64MiB on CPU, 512MiB on GPUs)",
    )
    parser.add_argument("--min-bytes", type=_byte_size, default=4, metavar="SIZE", help="smallest buffer (default 4)")
    parser.add_argument("--size-factor", type=int_at_least(2), default=2, help="buffer size step factor (default 2)")
    parser.add_argument("--repeats", type=int_at_least(1), default=5, help="recorded repeats per cell (default 5)")
    parser.add_argument("--warmup", type=int_at_least(0), default=1, help="unrecorded repeats per cell (default 1)")
    parser.add_argument(
        "--concurrency", type=int_at_least(1), default=4, metavar="K",
        help="probe 1..K concurrent allreduces started together (default 4)",
    )
    parser.add_argument(
        "--load-ms", type=non_negative_float, default=5.0, metavar="MS",
        help="compute for MS ms on every rank before each timed allreduce, as training does before "
        "its allreduce (default 5; 0 probes idle ranks)",
    )
    parser.add_argument("--instance-type", default="local", help="catalog type the rows describe (default local)")
    parser.add_argument("--catalog", metavar="CATALOG.json", help="catalog file (default: the shipped one)")
    parser.add_argument("--device", help="device key of the rows (default: the catalog's)")
    parser.add_argument("--rated-network-gbps", type=float, help="rated network of the rows (default: the catalog's)")
    parser.add_argument("--gpus-per-instance", type=int_at_least(1),
                        help="workers per instance (default: the catalog's)")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                        help="default: nccl with CUDA, else gloo")
    parser.add_argument(
        "--timeout", type=positive_float, default=120.0, metavar="S",
        help="timeout of each collective and of the rendezvous (default 120)",
    )
    parser.add_argument(
        "--stall-timeout", type=positive_float, default=300.0, metavar="S",
        help="stop a world that shows no progress for S seconds (default 300)",
    )
    parser.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    parser.add_argument("--cluster", metavar="CLUSTER",
                        help="probe across machines of --instance-type: auto, HOST:PORT, ray://HOST:PORT (a running "
                             "Ray cluster whose nodes carry thrifty-type:<type>) or a cluster config file "
                             "(provider: ec2, see docs/ec2.md); default: worker processes of this host")
    parser.add_argument("--market", choices=("on_demand", "spot"), default="on_demand",
                        help="market of the cluster's machines (default on_demand)")


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces the measurement, every data setting spelled out."""
    words = ["thrifty", "probe-allreduce", "--world-sizes", ",".join(map(str, parse_world_sizes(args.world_sizes)))]
    words += ["--out", args.out]
    if args.max_bytes is not None:
        words += ["--max-bytes", str(args.max_bytes)]
    words += ["--min-bytes", str(args.min_bytes), "--size-factor", str(args.size_factor)]
    words += ["--repeats", str(args.repeats), "--warmup", str(args.warmup), "--concurrency", str(args.concurrency)]
    words += ["--load-ms", f"{args.load_ms:g}"]
    words += ["--instance-type", args.instance_type, "--backend", args.backend]
    if args.cluster:
        words += ["--market", args.market]
    for flag, value in (
        ("--catalog", args.catalog),
        ("--device", args.device),
        ("--rated-network-gbps", args.rated_network_gbps),
        ("--gpus-per-instance", args.gpus_per_instance),
        ("--cluster", args.cluster),
    ):
        if value is not None:
            words += [flag, str(value)]
    return shlex.join(words)


def _target(args: argparse.Namespace):
    from thrifty.runtime.measure import ProbeTarget

    given = (args.device, args.rated_network_gbps, args.gpus_per_instance)
    if any(v is None for v in given):
        from thrifty.datasets.catalog import load_catalog

        itype = load_catalog(args.catalog).get(args.instance_type)
        device = args.device or itype.device
        rated = itype.network_gbps if args.rated_network_gbps is None else args.rated_network_gbps
        gpus = args.gpus_per_instance or itype.gpus
    else:
        device, rated, gpus = given
    return ProbeTarget(args.instance_type, device, float(rated), int(gpus))


def run(args: argparse.Namespace) -> int:
    from thrifty.runtime.measure import ProbeConfig, probe_allreduce, write_probe_csv

    target = _target(args)
    config = ProbeConfig(
        world_sizes=parse_world_sizes(args.world_sizes),
        max_bytes=args.max_bytes,
        min_bytes=args.min_bytes,
        size_factor=args.size_factor,
        repeats=args.repeats,
        warmup=args.warmup,
        concurrency=args.concurrency,
        backend=args.backend,
        load_ms=args.load_ms,
        op_timeout_s=args.timeout,
        stall_timeout_s=args.stall_timeout,
    )
    start = time.monotonic()
    with _cluster_placement(args, target, config.world_sizes) as placement:
        if args.no_progress:
            rows = probe_allreduce(target, config, placement=placement)
        else:
            rows = _probe_with_bar(target, config, probe_allreduce, placement)
    elapsed = time.monotonic() - start
    write_probe_csv(rows, args.out)
    _print_summary(rows, args.out, elapsed, command_line(args))
    return 0


@contextlib.contextmanager
def _cluster_placement(args: argparse.Namespace, target: Any, world_sizes: tuple[int, ...]) -> Iterator[Any]:
    """None without ``--cluster``; else the `Placement` of every world on
    machines provisioned from the cluster, given back when the probe ends."""
    if not args.cluster:
        yield None
        return
    import uuid

    from thrifty.datasets.catalog import load_catalog
    from thrifty.runtime.measure import PROBE_PRELOAD
    from thrifty.runtime.cluster.spec import cluster_provider
    from thrifty.runtime.commands._on_cluster import placement_on

    gpus = target.gpus_per_instance
    provider = cluster_provider(args.cluster, f"probe-{uuid.uuid4().hex[:8]}", load_catalog(args.catalog),
                                PROBE_PRELOAD)
    try:
        machines = provider.provision(args.instance_type, -(-max(world_sizes) // gpus), args.market)
        yield placement_on(provider, machines, gpus, PROBE_PRELOAD)
    finally:
        provider.close()


def _probe_with_bar(target, config, probe, placement=None):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as bar:
        task = bar.add_task("allreduce probe", total=None)

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=f"allreduce probe, {label}")

        return probe(target, config, on_progress=update, placement=placement)


def peak_per_world(rows: list[dict]) -> dict[int, tuple[float, int, int]]:
    """Per world size: the best cell median busbw, with its buffer bytes and concurrency."""
    cells: dict[tuple[int, int, int], list[float]] = {}
    for r in rows:
        cells.setdefault((r["world_size"], r["buffer_bytes"], r["concurrent"]), []).append(r["busbw_bytes_per_s"])
    best: dict[int, tuple[float, int, int]] = {}
    for (n, size, k), values in cells.items():
        median = statistics.median(values)
        if n not in best or median > best[n][0]:
            best[n] = (median, size, k)
    return best


def _print_summary(rows: list[dict], out: str, elapsed_s: float, command: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="best per-transfer bus bandwidth (median over repeats)")
    for column in ("world size", "busbw GB/s", "buffer bytes", "concurrent"):
        table.add_column(column, justify="right")
    for n, (busbw, size, k) in sorted(peak_per_world(rows).items()):
        table.add_row(str(n), f"{busbw / 1e9:.3f}", str(size), str(k))
    console = Console()
    console.print(table)
    console.print(f"{len(rows)} rows ({rows[0]['backend'] if rows else '?'}) in {elapsed_s:.1f} s; wrote {out}")
    console.print(f"reproduce with: {command}")
