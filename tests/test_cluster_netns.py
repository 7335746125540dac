"""A Ray cluster whose nodes have separate network stacks: one node in each of
three Linux network namespaces that the module creates and deletes
(tests/netns.py), a driver in the first (tests/netns_ray_driver.py).
Whatever binds to loopback by accident cannot reach another node here, so
these tests prove that thrifty's cluster runtime uses the nodes' own
addresses:

- each node sees only its own namespace (its address and loopback);
- a `World` on `RayProvider.world_launcher` (the machines' agents fork the
  ranks, rank 0's agent hosts the store) allreduces in float64 over gloo, with
  the store on rank 0's node address and every TCP connection of every rank
  between the nodes' addresses, none on loopback;
- ``thrifty.runtime.train(..., cluster="<head>:6379")`` runs a plan of three
  machines, one per namespace, to the same parameters as a single process;
- closing leaves no namespace and no process.

Needs root and iproute2's `ip` (and a kernel that allows network namespaces);
skips with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="Ray is not installed; `pip install 'thrifty[ray]'` runs these tests")
pytest.importorskip("torch", reason="torch is not installed; `pip install 'thrifty[torch]'` runs these tests")
# after ray: Ray puts its own copy of psutil (ray/thirdparty_files) on sys.path
psutil = pytest.importorskip("psutil", reason="psutil (which Ray ships) is not importable")

import netns  # noqa: E402
from netns_ranks import rank_values  # noqa: E402
from test_cluster_ray import CONFIG, DEMO, TINY  # noqa: E402
from test_training_runtime_processes import max_difference, model_state  # noqa: E402
from test_training_runtime_units import plan_dict  # noqa: E402
from thrifty.runtime.ddp.steps import single_process_reference  # noqa: E402

pytestmark = pytest.mark.timeout(300)

SIZE = 3
# the machines the nodes are (by their marks), in member order: a plan of 2 x local-a and 1 x local-b,
# all spot, has one machine in each namespace
MACHINES = [("local-a", "spot"), ("local-a", "spot"), ("local-b", "spot")]
DRIVER = Path(__file__).with_name("netns_ray_driver.py")


@pytest.fixture(scope="module")
def cluster() -> Iterator[netns.RayCluster]:
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(f"{reason}: this test builds a Ray cluster in network namespaces")
    netns.remove_stale()
    with contextlib.ExitStack() as stack:
        try:
            network = stack.enter_context(netns.NetnsNetwork(SIZE))
        except netns.NetnsUnavailable as e:
            pytest.skip(f"this host does not let the tests create network namespaces ({e}); "
                        "a root shell with CAP_SYS_ADMIN and CAP_NET_ADMIN runs this test")
        yield stack.enter_context(netns.RayCluster(network, MACHINES))
    left = network.leftovers()
    assert not left, f"the namespaces' clean-up left: {left}"


def drive(cluster: netns.RayCluster, command: str, *args: str, timeout: float = 240) -> dict[str, Any]:
    """Run netns_ray_driver.py COMMAND OUT ARGS in the head's namespace; what it wrote to OUT."""
    out = cluster.network.work_dir / f"{command}.json"
    result = cluster.run_driver([sys.executable, str(DRIVER), command, str(out), *args],
                                name=f"driver-{command}", timeout=timeout)
    assert result.returncode == 0, f"the {command} driver exited with {result.returncode}:\n{result.output[-6000:]}"
    return json.loads(out.read_text())


def ipv4_seen(by_interface: dict[str, list[str]]) -> set[str]:
    return {address for addresses in by_interface.values() for address in addresses}


def test_each_node_sees_only_its_own_namespace(cluster):
    report = drive(cluster, "nodes", str(SIZE))
    members = cluster.network.members
    addresses = {m.address for m in members}

    for member, task in zip(members, report["tasks"]):
        assert task["node_ip"] == member.address
        assert task["interface"] == member.interface
        # its own address and loopback: no other namespace's address, nor the host's
        assert ipv4_seen(task["ipv4"]) == {"127.0.0.1", member.address}
    assert len({task["node_id"] for task in report["tasks"]}) == SIZE

    assert report["driver"]["node_ip"] == members[0].address
    assert ipv4_seen(report["driver"]["ipv4"]) == {"127.0.0.1", members[0].address}
    alive = {node["ip"]: node["resources"] for node in report["ray_nodes"] if node["alive"]}
    assert set(alive) == addresses
    for member in members:
        assert alive[member.address][cluster.resource(member.index)] == 1

    # the addresses exist only inside the namespaces
    host = {entry.address for entries in psutil.net_if_addrs().values() for entry in entries}
    assert not host & addresses


def test_a_world_on_the_ray_launcher_spans_the_namespaces(cluster):
    report = drive(cluster, "allreduce", str(SIZE))
    members = cluster.network.members
    addresses = {m.address for m in members}
    expected = [sum(column) for column in zip(*(rank_values(rank) for rank in range(SIZE)))]

    # the provider's machines are the nodes, at their own addresses; the store is on rank 0's
    assert report["machines"] == [[cluster.machine_id(m.index), m.address] for m in members]
    assert report["master"][0] == members[0].address
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == list(range(SIZE))
    for member, rank in zip(members, ranks):
        assert rank["master"] == report["master"]
        # forked on its own node: gloo bound to the interface that carries the node's address
        assert rank["interface"] == member.interface
        assert ipv4_seen(rank["ipv4"]) == {"127.0.0.1", member.address}
        assert rank["dtype"] == "torch.float64"
        assert rank["sum"] == expected
        # every connection the rank holds (a fresh fork: all the world's, to the store and gloo's full
        # mesh) runs between the nodes' own addresses, none on loopback, and it has one to each other rank
        local = {here for here, _ in rank["connections"]}
        remote = {there for _, there in rank["connections"]}
        assert local == {member.address}, rank["connections"]
        assert addresses - {member.address} <= remote <= addresses, rank["connections"]
        assert members[0].address in remote  # the store


def test_a_plan_trains_across_the_namespaces_like_one_process(cluster):
    run_dir = cluster.network.work_dir / "run"
    plan = plan_dict(("local-a", "spot", 2, 21), ("local-b", "spot", 1, 22))
    # a plan of its own, not the solver's: its predicted times are made up, so no slowdown re-plan
    config = dataclasses.replace(CONFIG, replan_on_slowdown=False)
    job = cluster.network.work_dir / "job.json"
    job.write_text(json.dumps({"plan": plan, "problem": str(DEMO), "trainer": TINY, "run_dir": str(run_dir),
                               "config": dataclasses.asdict(config)}))
    report = drive(cluster, "train", str(job))

    assert report["iterations"] == 600
    assert report["segments"] == [{"config": "2xlocal-a@21+1xlocal-b@22", "ended": "finished"}]
    assert (report["preemptions"], report["replans"]) == (0, 0)
    [launch] = [e for e in map(json.loads, (run_dir / "run.jsonl").read_text().splitlines()) if e["event"] == "launch"]
    # one rank on each namespace's node (machine n<i> is member i's node)
    assert sorted(launch["machines"]) == [cluster.machine_id(m.index) for m in cluster.network.members]
    trained = model_state(Path(report["checkpoint"]))
    assert max_difference(trained, single_process_reference(TINY, 64, 600)) < 1e-6


def test_closing_leaves_no_namespace_and_no_ray_process(cluster):
    """Runs last: closes the module's cluster and network itself (the
    fixture's close is then a no-op) and checks what is left."""
    network = cluster.network
    started = {pid: psutil.Process(pid) for i in range(SIZE) for pid in network.pids(i)}
    names = {p.name() for p in started.values()}
    assert {"raylet", "gcs_server"} <= names, f"the namespaces run {sorted(names)}"

    cluster.close()
    network.close()

    assert network.leftovers() == []
    assert [n for n in netns.list_namespaces() if n.startswith(f"{netns.PREFIX}{os.getpid()}-")] == []
    # not even a zombie: the subreapers collected them all
    assert [f"{pid} {p.name()}" for pid, p in started.items() if p.is_running()] == []
    assert not network.work_dir.exists()
