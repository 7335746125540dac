"""``--cluster`` of ``thrifty profile`` and ``thrifty profile-scaling``:
measure a profile on machines of each instance type taken from a cluster,
give them back, and keep what each type's measurement took and cost.

The types are measured one after the other: for each, the machines it needs
are asked for (`Provider.provision`), a rank is started on each and waited
for (`thrifty.runtime.measure.remote.wait_ready`: the launch-to-ready time,
split into SCALE, until the provider hands the machines over, and INIT, until
a rank runs on every one), the measurement runs there, and the machines are
given back before the next type's are asked for, so each machine is held
only for its own type's measurement. Whatever happens (a failure, Ctrl-C),
closing the provider gives back every machine it still holds.

The cost of a type is its machines' billing intervals as the provider
records them (asked for to given back) times the price it charged (the
catalog's, unless a cluster config asks for live prices), per second; the
profiles, latencies and costs go into one bundle file
(`thrifty.perfmodels.bundle`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from thrifty.core.errors import ProblemError

__all__ = ["TypeCost", "add_cluster_arguments", "check_cluster_arguments", "parse_instance_types", "measure_types",
           "placement_on", "write_bundle", "print_costs", "say_on_stderr"]


@dataclass(frozen=True)
class TypeCost:
    """What measuring one instance type took (a bundle's ``machines`` entry)."""

    instance_type: str
    count: int
    scale_latency_s: float
    init_latency_s: float
    machine_s: float
    usd_per_hour: float

    @property
    def launch_to_ready_s(self) -> float:
        return self.scale_latency_s + self.init_latency_s

    @property
    def cost_usd(self) -> float:
        return self.machine_s * self.usd_per_hour / 3600.0

    def record(self) -> dict[str, Any]:
        return {"count": self.count, "scale_latency_s": round(self.scale_latency_s, 4),
                "init_latency_s": round(self.init_latency_s, 4),
                "launch_to_ready_s": round(self.launch_to_ready_s, 4), "machine_s": round(self.machine_s, 3),
                "usd_per_hour": self.usd_per_hour, "cost_usd": round(self.cost_usd, 6)}


def add_cluster_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--cluster", metavar="CLUSTER",
                        help=f"measure {what} on machines of each of --instance-types taken from this cluster, "
                             "then given back: auto, HOST:PORT, ray://HOST:PORT (a running Ray cluster whose nodes "
                             "carry thrifty-type:<type>) or a cluster config file (provider: ec2, see docs/ec2.md); "
                             "--out is then a profile bundle, one profile per type (default: this host)")
    parser.add_argument("--instance-types", metavar="A,B,C",
                        help="with --cluster: the catalog types to measure on, one after the other")
    parser.add_argument("--market", choices=("on_demand", "spot"),
                        help="with --cluster: the market of the machines (default on_demand)")
    parser.add_argument("--catalog", metavar="CATALOG.json",
                        help="with --cluster: the catalog of the types and prices (default: the shipped one)")


def check_cluster_arguments(args: argparse.Namespace) -> None:
    """Options that need ``--cluster`` given without it, or ``--cluster``
    without types: a `ProblemError` (exit 2)."""
    if args.cluster is None:
        given = [flag for flag, value in (("--instance-types", args.instance_types), ("--market", args.market),
                                          ("--catalog", args.catalog)) if value is not None]
        if given:
            verb = "need" if len(given) > 1 else "needs"
            raise ProblemError(f"{' and '.join(given)} {verb} --cluster (the cluster whose machines are measured)")
    elif not args.instance_types:
        raise ProblemError("--cluster needs --instance-types: the catalog types to measure on (e.g. A,B,C)")


def parse_instance_types(text: str, catalog: Any) -> list[Any]:
    """``"A,B"`` -> the catalog's types A and B, in that order, each once;
    an unknown name is a `ProblemError` naming the closest ones."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ProblemError(f"--instance-types is '{text}', but must name catalog types separated by commas")
    out = []
    for name in dict.fromkeys(names):
        try:
            out.append(catalog.get(name))
        except ProblemError as e:
            raise ProblemError(f"--instance-types: {e.message}") from None
    return out


def placement_on(provider: Any, machines: Sequence[Any], gpus: int, preload: Sequence[str]) -> Callable[[int], Any]:
    """The placement (`thrifty.runtime.measure.Placement`) of a world of `n`
    ranks on `machines`, `gpus` ranks per machine: rank r on machine
    ``r // gpus`` as its local rank ``r % gpus``."""

    def placement(n: int) -> tuple[Any, Callable[[int], Mapping[str, str]]]:
        ids = [machines[r // gpus].id for r in range(n)]

        def rank_env(rank: int) -> dict[str, str]:
            return {"LOCAL_RANK": str(rank % gpus), "GROUP_RANK": str(rank // gpus),
                    "LOCAL_WORLD_SIZE": str(min(gpus, n - rank // gpus * gpus))}

        return provider.world_launcher(ids, preload), rank_env

    return placement


def measure_types(cluster: str, catalog: Any, types: Sequence[Any], market: str,
                  count_of: Callable[[Any], int], measure: Callable[[Any, Any, list[Any]], dict[str, Any]],
                  timeout_s: float, say: Callable[[str], None] = lambda _line: None,
                  ) -> tuple[dict[str, dict[str, Any]], list[TypeCost]]:
    """For each type (one after the other): take ``count_of(type)`` machines
    of it from `cluster` in `market`, wait for a rank on each, run
    ``measure(type, provider, machines)`` (a profile document), give the
    machines back. Returns the documents by type and what each type took."""
    from thrifty.runtime.cluster.spec import cluster_provider
    from thrifty.runtime.measure import REMOTE_PRELOAD, wait_ready

    provider = cluster_provider(cluster, f"profile-{uuid.uuid4().hex[:8]}", catalog, REMOTE_PRELOAD)
    profiles: dict[str, dict[str, Any]] = {}
    costs: list[TypeCost] = []
    try:
        provider.check_plan([(t.name, market, count_of(t)) for t in types])
        for itype in types:
            count = count_of(itype)
            say(f"{itype.name}: asking for {count} machine{'s' if count > 1 else ''} ({market})")
            asked = time.monotonic()
            machines = provider.provision(itype.name, count, market)  # type: ignore[arg-type]
            handed = time.monotonic()
            try:
                launcher = provider.world_launcher([m.id for m in machines], REMOTE_PRELOAD)
                ready = wait_ready(launcher, count, timeout_s)
                say(f"{itype.name}: ready {ready - asked:.1f} s after asking; measuring")
                profiles[itype.name] = measure(itype, provider, machines)
            finally:
                ended = provider.terminate(machines)
            held = sum(max(0.0, (m.terminated_at or m.launched_at) - m.launched_at) for m in ended)
            costs.append(TypeCost(itype.name, count, handed - asked, ready - handed, held,
                                  float(machines[0].price_per_hour)))
    finally:
        provider.close()
    return profiles, costs


def write_bundle(path: str, kind: str, model: str, cluster: str, market: str, command: str,
                 profiles: Mapping[str, dict[str, Any]], costs: Sequence[TypeCost]) -> None:
    """Write the bundle atomically, checked as a reader will check it."""
    from thrifty.core.io import write_json
    from thrifty.perfmodels.bundle import BUNDLE_FORMAT, parse_bundle

    document = {"format": BUNDLE_FORMAT, "kind": kind, "model": model, "cluster": cluster, "market": market,
                "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"), "command": command,
                "profiles": dict(profiles), "machines": {c.instance_type: c.record() for c in costs},
                "total_cost_usd": round(sum(c.cost_usd for c in costs), 6)}
    parse_bundle(document, source=path)  # never write a file that does not load
    write_json(path, document)


def say_on_stderr(line: str) -> None:
    from rich.console import Console

    Console(stderr=True).print(line)


def print_costs(costs: Sequence[TypeCost], market: str, out: str) -> None:
    """The cost table: per type, its machines, latencies, machine-seconds, price and cost; the total."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"what the profiling cost ({market})")
    for column in ("instance type", "machines", "scale s", "init s", "machine-s", "$/h", "cost $"):
        table.add_column(column, justify="right")
    for c in costs:
        table.add_row(c.instance_type, str(c.count), f"{c.scale_latency_s:.2f}", f"{c.init_latency_s:.2f}",
                      f"{c.machine_s:.1f}", f"{c.usd_per_hour:.4g}", f"{c.cost_usd:.6f}")
    console = Console()
    console.print(table)
    console.print(f"total cost ${sum(c.cost_usd for c in costs):.6f} "
                  f"({sum(c.machine_s for c in costs):.1f} machine-seconds); wrote {out}")
