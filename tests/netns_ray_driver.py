"""Ray drivers for tests/test_cluster_netns.py. Each runs inside a namespace of
a ``netns.RayCluster`` (``RayCluster.run_driver``, which sets ``RAY_ADDRESS``
to the head), does its work on the cluster and writes what it saw as JSON to
OUT; the test asserts on that.

    python netns_ray_driver.py nodes OUT.json SIZE
    python netns_ray_driver.py allreduce OUT.json SIZE
    python netns_ray_driver.py train OUT.json JOB.json

``nodes`` pins a plain Ray task to each node. ``allreduce`` and ``train``
use thrifty's own machinery only: a `RayProvider` on the cluster hands out
its nodes as machines, each with its agent, and a `World` on the provider's
Ray launcher runs `netns_ranks.allreduce` on them; ``thrifty.runtime.train``
with ``cluster=HOST:PORT`` runs a plan (JOB.json: ``plan``, ``problem``,
``trainer``, ``config``, ``run_dir``).

Ray ships this script's folder to its workers' sys.path, and thrifty's Ray
launcher hands the driver's sys.path to the ranks it starts, so both import
``netns`` and ``netns_ranks``.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import ray  # first: Ray puts its own copy of psutil (ray/thirdparty_files) on sys.path
import psutil  # noqa: I001

from netns import RayCluster, interface_carrying
from netns_ranks import ipv4_by_interface

CATALOG = Path(__file__).resolve().parents[1] / "datasets" / "examples" / "local-demo-catalog.json"


@ray.remote(num_cpus=0)
def node_report() -> dict[str, Any]:
    node_ip = ray.util.get_node_ip_address()
    return {"node_ip": node_ip, "node_id": ray.get_runtime_context().get_node_id(),
            "interface": interface_carrying(node_ip, psutil.net_if_addrs()), "ipv4": ipv4_by_interface()}


def nodes(size: str) -> dict[str, Any]:
    """A task pinned to each node (by its machine resource) reports the node's
    address and the interfaces it sees; the driver reports its own view and Ray's."""
    ray.init(log_to_driver=False, configure_logging=False)
    try:
        pinned = [node_report.options(resources={RayCluster.resource(i): 1}).remote() for i in range(int(size))]
        return {"tasks": ray.get(pinned, timeout=120),
                "driver": {"node_ip": ray.util.get_node_ip_address(), "ipv4": ipv4_by_interface()},
                "ray_nodes": [{"ip": n["NodeManagerAddress"], "alive": n["Alive"], "resources": n["Resources"]}
                              for n in ray.nodes()]}
    finally:
        ray.shutdown()


def provision_all(provider: Any, size: int) -> list[Any]:
    """Every node of the cluster as a machine of `provider`, by type and
    market as the nodes' marks say; the machines in member order (machine
    ``n<i>`` is member i's node)."""
    from thrifty.runtime.cluster.provider import cluster_nodes

    wanted = Counter((n["instance_type"], n["market"]) for n in cluster_nodes(provider.ray))
    made = {m.id: m for (instance_type, market), count in wanted.items()
            for m in provider.provision(instance_type, count, market)}
    return [made[RayCluster.machine_id(i)] for i in range(size)]


def allreduce(size: str) -> dict[str, Any]:
    """A thrifty world of one rank per machine, rank i on member i's node:
    the machines' agents fork the ranks, rank 0's agent hosts the store."""
    from thrifty.datasets.catalog import load_catalog
    from thrifty.runtime.worlds import World
    from thrifty.runtime.cluster.provider import RayProvider

    provider = RayProvider("netns-allreduce", load_catalog(CATALOG), os.environ["RAY_ADDRESS"])
    try:
        machines = provision_all(provider, int(size))
        launcher = provider.world_launcher([m.id for m in machines])
        logs = Path(os.environ["THRIFTY_NETNS"]) / "logs"  # the network's work folder (netns.NetnsNetwork.marker)
        world = World(len(machines), "netns_ranks:allreduce", launcher=launcher, timeout_s=60,
                      logs=lambda rank: logs / f"allreduce-rank{rank}.log", where="the allreduce world")
        ranks = world.run(stall_timeout_s=90)
        return {"master": list(world.master or ()), "machines": [[m.id, m.host] for m in machines], "ranks": ranks}
    finally:
        provider.close()


def train(job_file: str) -> dict[str, Any]:
    """``thrifty.runtime.train`` of JOB.json's plan on this cluster (``cluster=HOST:PORT``)."""
    from thrifty.runtime import train as run
    from thrifty.runtime.training import RunConfig

    job = json.loads(Path(job_file).read_text())
    result = run(job["plan"], job["trainer"], problem=job["problem"], cluster=os.environ["RAY_ADDRESS"],
                 run_dir=job["run_dir"], config=RunConfig(**job["config"]))
    return {"iterations": result.iterations, "elapsed_s": result.elapsed_s, "checkpoint": str(result.checkpoint_path),
            "segments": [{"config": s.config, "ended": s.ended} for s in result.segments],
            "preemptions": len(result.preemptions), "replans": len(result.replans)}


def main(argv: list[str]) -> int:
    command, out, *args = argv
    report = {"nodes": nodes, "allreduce": allreduce, "train": train}[command](*args)
    with open(out, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
