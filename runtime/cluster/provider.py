"""`RayProvider`: the machines of a Ray cluster, for the training driver.

A machine is a Ray node. In a running cluster (``--cluster auto`` or
``ray://HOST:PORT``, or ``HOST:PORT``), nodes say what they are with custom
resources (`thrifty.runtime.cluster.resources`): ``thrifty-type:<instance
type>``, optionally ``thrifty-market:spot`` and ``thrifty-machine:<id>``;
`provision` hands out free nodes of the type and market asked for (a
`CapacityError` when the cluster has too few, which the driver turns into a
re-plan, as with a cloud's capacity error), and `check_plan` says before a
run which of a plan's machines the cluster lacks. With a `source` provider
(EC2), `provision` starts new machines there, whose boot script joins them
to this cluster (``thrifty node join``), and waits for their nodes to join
(`join_timeout_s`; a machine that never joins is given back and counts as a
capacity failure).

Each machine gets an agent (`thrifty.runtime.cluster.agent.MachineAgent`)
when it is provisioned; `world_launcher` gives whatever starts a world (the
training driver, a tuning trial, the allreduce probe) a
`thrifty.runtime.worlds.ray.RayLauncher` over the agents of its machines. `poll_interruptions`
reports, never blocking: spot notices the agents read from their machine's
metadata service (``source="imds"``, with the time left), nodes the cluster
reports dead (``source="node-lost"``), and what the source provider reports.
Prices come from the catalog (or the source provider). With a `log_path`
(the run's ``logs/driver.log``), what Ray and torch print in this process
goes there while the provider is open (`thrifty.runtime.cluster.driver_log`).
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thrifty.datasets.catalog import Catalog
from thrifty.core.errors import ProblemError, ProviderError
from thrifty.runtime.cluster.connect import connect, import_ray
from thrifty.runtime.cluster.driver_log import DriverLog
from thrifty.runtime.worlds.ray import RayLauncher
from thrifty.runtime.cluster.resources import machine_resource, node_marks
from thrifty.runtime.events import Preemption
from thrifty.runtime.providers.base import CapacityError, Machine, Market, Provider

if TYPE_CHECKING:
    from thrifty.runtime.cluster.head import RayHead

__all__ = ["RayProvider", "cluster_nodes", "live_nodes", "lacking", "lacking_message"]

NODE_CHECK_S = 1.0  # how often the cluster's node table is read for dead nodes
NOTICE_POLL_S = 0.02  # how often the agents' open notice calls are checked (ray.wait, no waiting)
NOTICE_WAIT_S = 5.0  # each agent's notice call is a long poll of this length


def cluster_nodes(ray: Any) -> list[dict[str, Any]]:
    """The live nodes of the cluster this process has joined (`live_nodes` of ``ray.nodes()``)."""
    return live_nodes(ray.nodes())


def live_nodes(table: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The live nodes of a node table (``ray.nodes()``, `thrifty.runtime.cluster.connect.read_nodes`):
    ``{"node_id", "ip", "machine_id", "instance_type", "market", "resources"}``."""
    out = []
    for node in table:
        if not node.get("Alive"):
            continue
        machine_id, instance_type, market = node_marks(node.get("Resources", {}))
        out.append({"node_id": node["NodeID"], "ip": node["NodeManagerAddress"], "machine_id": machine_id,
                    "instance_type": instance_type, "market": market, "resources": node.get("Resources", {})})
    return out


def lacking(nodes: Sequence[Mapping[str, Any]], wanted: Iterable[tuple[str, str, int]]) -> list[str]:
    """What live `nodes` lack of machines ``(instance type, market, count)``:
    one ``"COUNT x TYPE (MARKET): the cluster has N"`` per shortfall."""
    out = []
    for instance_type, market, count in wanted:
        have = sum(1 for n in nodes if (n["instance_type"], n["market"]) == (instance_type, market))
        if have < count:
            out.append(f"{count} x {instance_type} ({market}): the cluster has {have}")
    return out


def lacking_message(address: str, nodes: Sequence[Mapping[str, Any]], shortfalls: Sequence[str],
                    what: str = "the plan") -> str:
    """The error of a cluster at `address` whose `nodes` lack machines `what` needs (`lacking`), with how
    a node offers them and what the nodes here offer."""
    offered = sorted({f"{n['instance_type']} ({n['market']})" for n in nodes if n["instance_type"]})
    return (f"the Ray cluster at {address} lacks machines {what} needs: {'; '.join(shortfalls)}. "
            "A node offers an instance type with the resource "
            "'thrifty-type:<type>' (and 'thrifty-market:spot' for spot), e.g. ray start "
            "--resources='{\"thrifty-type:p3.8xlarge\": 1}'; "
            f"nodes here offer: {', '.join(offered) or 'none'}")


class RayProvider(Provider):
    name = "ray"
    local_workers = False
    catalog: Catalog

    def __init__(self, run_id: str, catalog: Catalog, address: str = "auto", *, source: Provider | None = None,
                 join_timeout_s: float = 600.0, imds_interval_s: float = 5.0, preload: Sequence[str] = (),
                 head: RayHead | None = None, log_path: str | Path | None = None):
        super().__init__(run_id)
        self.head = head  # a head this run started: stopped by `close`, after everything else
        self.catalog, self.address, self.source = catalog, address, source
        self.join_timeout_s, self.imds_interval_s = join_timeout_s, imds_interval_s
        self.preload = tuple(preload)
        self.ray = import_ray()
        # from joining the cluster until `close`, what Ray and torch print here goes to the run's log
        self.driver_log = DriverLog(log_path).start() if log_path is not None else None
        try:
            connect(address)
        except BaseException:
            self._stop_log()
            raise
        self._agents: dict[str, Any] = {}
        self._node_of: dict[str, str] = {}  # machine id -> Ray node id
        self._idle_agents: dict[str, Any] = {}  # Ray node id -> the agent of a pool node given back
        self._notice_calls: dict[str, Any] = {}
        self._reported: set[str] = set()
        self._node_checked = self._notices_checked = 0.0
        self._ids = itertools.count()

    # -- machines ---------------------------------------------------------------------------
    def price(self, instance_type: str, market: str = "on_demand") -> float:
        if self.source is not None:
            return self.source.price(instance_type, market)
        return self.catalog.get(instance_type).price(market)

    def free_nodes(self, instance_type: str, market: str) -> list[dict[str, Any]]:
        held = set(self._node_of.values())
        return [n for n in cluster_nodes(self.ray)
                if n["instance_type"] == instance_type and n["market"] == market and n["node_id"] not in held]

    def pool_capacity(self) -> dict[tuple[str, str], int] | None:
        """How many machines of each (instance type, market) the cluster's
        live nodes offer; None with a source provider (it starts machines)."""
        if self.source is not None:
            return None
        out: dict[tuple[str, str], int] = {}
        for n in cluster_nodes(self.ray):
            if n["instance_type"]:
                out[(n["instance_type"], n["market"])] = out.get((n["instance_type"], n["market"]), 0) + 1
        return out

    def check_plan(self, allocations: Iterable[tuple[str, str, int]]) -> None:
        """Raise `ProblemError` naming what the cluster lacks for machines
        ``(instance type, market, count)`` (nothing to check with a source
        provider: it starts what is asked)."""
        if self.source is not None:
            return
        nodes = cluster_nodes(self.ray)
        shortfalls = lacking(nodes, allocations)
        if shortfalls:
            raise ProblemError(lacking_message(self.address, nodes, shortfalls), path="cluster")

    def provision(self, instance_type: str, count: int, market: Market = "on_demand",
                  timeout_s: float = 600.0) -> list[Machine]:
        if count < 1:
            raise ProblemError(f"count is {count}, but must be at least 1")
        if self.source is not None:
            return self._provision_joined(instance_type, count, market, timeout_s)
        nodes = self.free_nodes(instance_type, market)
        if len(nodes) < count:
            raise CapacityError(instance_type, market, f"the Ray cluster has {len(nodes)} free {instance_type} "
                                f"({market}) nodes, {count} wanted")
        price, now = self.price(instance_type, market), self.now()
        made = [Machine(self._lease_id(n), instance_type, market, n["ip"],
                        now, price, tags={"thrifty-run": self.run_id, "ray-node": n["node_id"]})
                for n in nodes[:count]]
        self._own(made)
        self._start_agents(made, [n for n in nodes[:count]])
        return made

    def _lease_id(self, node: Mapping[str, Any]) -> str:
        """The id of a new lease of `node`: its machine id (an EC2 instance id,
        from its resources) the first time this run takes it; that id with a
        lease number when the run takes the same node again after giving it
        back, so the first lease's record (and its bill) is not overwritten;
        ``ray-<run>-<n>`` for a node without one."""
        base = node.get("machine_id")
        if not base:
            return f"ray-{self.run_id}-{next(self._ids)}"
        with self._lock:
            taken = base in self._machines
        return f"{base}~{next(self._ids)}" if taken else base

    def _provision_joined(self, instance_type: str, count: int, market: Market, timeout_s: float) -> list[Machine]:
        assert self.source is not None
        started = self.source.provision(instance_type, count, market, timeout_s)
        deadline = time.monotonic() + self.join_timeout_s
        wanted = {m.id for m in started}
        joined: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            joined = {n["machine_id"]: n for n in cluster_nodes(self.ray) if n["machine_id"] in wanted}
            if len(joined) == len(wanted):
                break
            time.sleep(0.5)
        missing = [m for m in started if m.id not in joined]
        if missing:
            self.source.terminate(started)
            raise CapacityError(instance_type, market, f"{len(missing)} of {count} {instance_type} ({market}) "
                                f"machines did not join the Ray cluster within {self.join_timeout_s:g} s "
                                f"({', '.join(m.id for m in missing)}); terminated them")
        made = [Machine(m.id, m.instance_type, m.market, joined[m.id]["ip"], m.launched_at, m.price_per_hour,
                        tags={**m.tags, "ray-node": joined[m.id]["node_id"]}) for m in started]
        self._own(made)
        self._start_agents(made, [joined[m.id] for m in started])
        return made

    def _start_agents(self, machines: Sequence[Machine], nodes: Sequence[Mapping[str, Any]]) -> None:
        """An agent for each machine: on a node of the pool that had one before in this run (given back,
        taken again), that agent, whose fork server is warm, given the new lease; else a new one."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from thrifty.runtime.cluster.agent import MachineAgent

        actor = self.ray.remote(MachineAgent)
        for machine, node in zip(machines, nodes):
            kept = self._idle_agents.pop(node["node_id"], None)
            if kept is not None:
                kept.lease.remote(machine.id)  # an actor runs one caller's calls in order: before any launch
                self._agents[machine.id] = kept
            else:
                options: dict[str, Any] = {"num_cpus": 0, "max_concurrency": 8, "name": None,
                                           "scheduling_strategy": NodeAffinitySchedulingStrategy(node["node_id"],
                                                                                                 soft=False)}
                if node.get("machine_id"):
                    options["resources"] = {machine_resource(node["machine_id"]): 1}
                self._agents[machine.id] = actor.options(**options).remote(
                    machine.id, machine.instance_type, machine.market, self.preload, self.imds_interval_s)
            self._node_of[machine.id] = node["node_id"]

    def agent(self, machine_id: str) -> Any:
        if machine_id not in self._agents:
            raise ProviderError(f"machine {machine_id} has no agent: it is not a machine of run {self.run_id}")
        return self._agents[machine_id]

    def world_launcher(self, machine_ids: Sequence[str], preload: Sequence[str] = ()) -> RayLauncher:
        """The launcher of a world whose rank r runs on machine `machine_ids[r]`."""
        return RayLauncher([self.agent(m) for m in machine_ids])

    def terminate(self, machines: Iterable[Machine]) -> list[Machine]:
        """Give machines back: a source's are terminated with their agents; a pool node becomes free
        again and keeps its agent (and the agent's warm fork server) for this run's next lease of it."""
        machines = list(machines)
        for m in machines:
            self._drop_agent(m.id, keep=self.source is None)
        if self.source is not None:
            ended = self.source.terminate(machines)
            self._own(ended)
            return ended
        return super().terminate(machines)

    def _drop_agent(self, machine_id: str, keep: bool = False) -> None:
        agent = self._agents.pop(machine_id, None)
        node_id = self._node_of.pop(machine_id, None)
        self._notice_calls.pop(machine_id, None)
        if agent is None:
            return
        if keep and node_id is not None:
            self._idle_agents[node_id] = agent
            return
        self._kill(agent)

    def _kill(self, agent: Any) -> None:
        try:
            self.ray.kill(agent)
        except Exception:  # noqa: BLE001 - already gone with its node
            pass

    def close(self) -> None:
        try:
            for machine_id in list(self._agents):
                self._drop_agent(machine_id)
            for agent in self._idle_agents.values():
                self._kill(agent)
            self._idle_agents = {}
            if self.source is not None:
                self.source.close()
                self._own(self.source.all_machines())
            else:
                super().close()
        finally:
            try:
                if self.ray.is_initialized():
                    # Object refs and actor handles in garbage die now, while the core worker runs: Ray's own
                    # GC thread collecting them while it shuts down exits the process ("The core worker has
                    # already been shutdown ... The process will exit"), with code 1, after a finished run.
                    gc.collect()
                    self.ray.shutdown()
                if self.head is not None:
                    self.head.stop()
            finally:
                self._stop_log()

    def _stop_log(self) -> None:
        if self.driver_log is not None:
            self.driver_log.stop()

    # -- interruptions --------------------------------------------------------------------------
    def poll_interruptions(self) -> list[Preemption]:
        out: list[Preemption] = list(self.source.poll_interruptions()) if self.source is not None else []
        now = time.monotonic()
        if now - self._notices_checked >= NOTICE_POLL_S:
            self._notices_checked = now
            out += self._agent_notices()
        if now - self._node_checked >= NODE_CHECK_S:
            self._node_checked = now
            out += self._dead_nodes()
        return out

    def _agent_notices(self) -> list[Preemption]:
        out = []
        if self._notice_calls:
            calls = list(self._notice_calls.items())
            ready, _ = self.ray.wait([ref for _, ref in calls], num_returns=len(calls), timeout=0)
            done = {id(r) for r in ready}
            for machine_id, ref in calls:
                if id(ref) not in done:
                    continue
                del self._notice_calls[machine_id]
                try:
                    out += [Preemption(**n) for n in self.ray.get(ref)]
                except self.ray.exceptions.RayError:  # its node is gone: `_dead_nodes` says so
                    pass
        for machine_id, agent in self._agents.items():
            if machine_id not in self._notice_calls:
                self._notice_calls[machine_id] = agent.notices.remote(NOTICE_WAIT_S)
        return out

    def _dead_nodes(self) -> list[Preemption]:
        alive = {n["node_id"] for n in cluster_nodes(self.ray)}
        for node_id in [n for n in self._idle_agents if n not in alive]:
            del self._idle_agents[node_id]  # gone with its node
        out = []
        with self._lock:
            held = {m.id: m for m in self._machines.values() if m.terminated_at is None}
        for machine_id, node_id in list(self._node_of.items()):
            if node_id not in alive and machine_id not in self._reported and machine_id in held:
                self._reported.add(machine_id)
                m = held[machine_id]
                out.append(Preemption(m.instance_type, m.market, "node-lost", machine_id, 0.0,
                                      f"the Ray cluster reports node {node_id[:12]} ({m.host}) dead"))
        return out
