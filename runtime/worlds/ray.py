"""A world's ranks on the machines of a Ray cluster: both sides of it.

The driver's side is `RayLauncher`, the `thrifty.runtime.worlds.launcher.Launcher`
of worlds whose ranks run on Ray nodes: rank r runs on the machine of
`agents[r]` (an actor of a `NodeRanks` subclass, one per machine:
`thrifty.runtime.cluster.agent.MachineAgent`), forked there by that machine's
fork server; the rendezvous store is hosted by rank 0's agent on its node's
address (``MASTER_ADDR``), and this process is a client of it.

The node's side is `NodeRanks`: what an agent does for the worlds of its
machine (start the machine's fork server, host a world's store, fork ranks,
report their exit codes, kill and reap them). The
cluster code makes it a Ray actor and adds what is about the machine itself
(its lease, its spot notices).

Watching never blocks: exit codes come from one ``exit_codes`` call per
agent in flight at a time, collected with ``ray.wait(timeout=0)``. An agent
whose call fails with ``RayActorError`` (its node died, or it was killed) has
lost its ranks: they report exit code -9, as a machine taken away without
notice does under the local launcher, and `machine_lost` says so.

Ray is imported when a launcher is made (`thrifty.core.optional.require`),
torch when a store is hosted; importing this module imports neither.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from thrifty.core.optional import require
from thrifty.runtime.worlds.network import interface_of
from thrifty.runtime.worlds.zygote import WorkerProcess, start_zygote, zygote

__all__ = ["RayLauncher", "RayRankProcess", "NodeRanks"]

REFRESH_S = 0.1         # at most one round of exit-code calls this often while the world trains
HURRY_REFRESH_S = 0.01  # and while it is ending (`hurry`): the next world waits for these exits
LOST_CODE = -9


class RayRankProcess:
    """A rank forked on a Ray node, seen from the driver."""

    def __init__(self, launcher: "RayLauncher", rank: int, pid: int):
        self.launcher, self.rank, self.pid = launcher, rank, pid

    @property
    def exitcode(self) -> int | None:
        return self.launcher.exit_code(self.rank)

    @property
    def machine_lost(self) -> bool:
        return self.launcher.agent_lost(self.rank)

    @property
    def server_alive(self) -> bool:
        return True  # a lost agent's ranks have their exit code (-9): one always comes

    def kill(self) -> None:
        self.launcher.kill([self.rank])

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.exitcode is None and time.monotonic() < deadline:
            time.sleep(REFRESH_S)


class RayLauncher:
    """Ranks on Ray nodes: `agents[r]` is rank r's machine agent (an actor handle)."""

    where = "the Ray cluster"
    on_this_host = False

    def __init__(self, agents: Sequence[Any]):
        self._ray: Any = require("ray", "ray")
        self.agents = list(agents)
        self._unique: list[Any] = []
        for agent in self.agents:
            if all(agent is not a for a in self._unique):
                self._unique.append(agent)
        self._index = [next(i for i, a in enumerate(self._unique) if a is agent) for agent in self.agents]
        self._pids: dict[int, int] = {}
        self._codes: dict[int, int | None] = {}
        self._pending: dict[int, Any] = {}  # agent index -> its exit_codes call in flight
        self._refresh_s = REFRESH_S
        self._asked_at: dict[int, float] = {}
        self._answered_at: dict[int, float] = {}
        self._lost: set[int] = set()
        self._refreshed = 0.0
        self._store: tuple[int, int] | None = None  # (agent index, port)

    # -- Launcher ----------------------------------------------------------------------------
    def rendezvous(self, timeout_s: float) -> tuple[str, int, Any]:
        dist = require("torch.distributed", "torch", package="torch")
        owner = self._index[0]
        address, port = self._ray.get(self._unique[owner].host_store.remote(timeout_s), timeout=timeout_s)
        self._store = (owner, port)
        client = dist.TCPStore(address, port, None, False, timedelta(seconds=timeout_s))
        return address, port, client

    def network_env(self, rank: int, backend: str) -> dict[str, str]:
        return self._ray.get(self.agents[rank].network_env.remote(backend), timeout=60)

    def launch(self, rank: int, entry: str, argv: list[str], env: dict[str, str], log: str) -> RayRankProcess:
        pid = self._ray.get(self.agents[rank].launch.remote(entry, argv, env, log, list(sys.path)), timeout=120)
        self._pids[rank], self._codes[rank] = pid, None
        return RayRankProcess(self, rank, pid)

    def close(self) -> None:
        by_agent: dict[int, list[int]] = {}
        for rank, pid in self._pids.items():
            by_agent.setdefault(self._index[rank], []).append(pid)
        refs = [self._unique[i].reap.remote(pids) for i, pids in by_agent.items() if i not in self._lost]
        if self._store is not None and self._store[0] not in self._lost:
            refs.append(self._unique[self._store[0]].drop_store.remote(self._store[1]))
        self._wait_quietly(refs, 30.0)
        self._pending.clear()  # no object ref of this world outlives it (nor the driver's Ray session)

    # -- watching ----------------------------------------------------------------------------
    def exit_code(self, rank: int) -> int | None:
        self.refresh()
        return self._codes.get(rank)

    def agent_lost(self, rank: int) -> bool:
        self.refresh()
        return self._index[rank] in self._lost

    def settled(self, since: float) -> bool:
        """Whether every agent has answered a call asked after `since`
        (monotonic), or is known lost: what the exit codes say is then no
        older than `since`."""
        self.refresh(force=True)
        return all(i in self._lost or self._answered_at.get(i, -1.0) >= since and
                   self._asked_at.get(i, -1.0) >= since for i in range(len(self._unique)))

    def hurry(self) -> None:
        """The world is ending and its exits are awaited: ask the agents often
        from now on. While it trains, each round of calls costs the agents CPU
        that the ranks beside them need, so rounds are rarer then (`REFRESH_S`)."""
        self._refresh_s = HURRY_REFRESH_S

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._refreshed < self._refresh_s:
            return
        self._refreshed = now
        ray = self._ray
        if self._pending:
            ready, _ = ray.wait(list(self._pending.values()), num_returns=len(self._pending), timeout=0)
            done = {id(r) for r in ready}
            for i, ref in list(self._pending.items()):
                if id(ref) not in done:
                    continue
                del self._pending[i]
                try:
                    answer = ray.get(ref)
                except ray.exceptions.RayActorError:
                    self._mark_lost(i)
                    continue
                self._answered_at[i] = self._asked_at[i]
                for rank, pid in self._pids.items():
                    if self._index[rank] == i and pid in answer:
                        self._codes[rank] = answer[pid]
        for i, agent in enumerate(self._unique):
            if i in self._pending or i in self._lost:
                continue
            pids = [pid for rank, pid in self._pids.items() if self._index[rank] == i and self._codes[rank] is None]
            self._asked_at[i] = now
            self._pending[i] = agent.exit_codes.remote(pids)

    def _mark_lost(self, index: int) -> None:
        self._lost.add(index)
        for rank in self._pids:
            if self._index[rank] == index and self._codes[rank] is None:
                self._codes[rank] = LOST_CODE

    def kill(self, ranks: Sequence[int]) -> None:
        by_agent: dict[int, list[int]] = {}
        for rank in ranks:
            if rank in self._pids and self._index[rank] not in self._lost:
                by_agent.setdefault(self._index[rank], []).append(self._pids[rank])
        for i, pids in by_agent.items():
            self._unique[i].kill.remote(pids)

    def _wait_quietly(self, refs: list[Any], timeout_s: float) -> None:
        if not refs:
            return
        ready, _ = self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref in ready:
            try:
                self._ray.get(ref)
            except self._ray.exceptions.RayError:
                pass


class NodeRanks:
    """One machine's side of the worlds whose ranks it runs (see the module
    docstring): a plain class, made a Ray actor by its cluster subclass.
    `preload`: the modules the machine's fork server imports, started at
    once (torch imported while the rest of the plan's machines come up)."""

    def __init__(self, preload: Sequence[str] = ()):
        ray = require("ray", "ray")
        self.node_ip = ray.util.get_node_ip_address()
        self.preload = tuple(preload)
        self._stores: dict[int, Any] = {}
        self._procs: dict[int, WorkerProcess] = {}
        self._lock = threading.Lock()
        start_zygote(self.preload)

    def ready(self) -> bool:
        """Wait for this machine's fork server (its torch import)."""
        zygote(self.preload)
        return True

    # -- the rendezvous ------------------------------------------------------------------
    def host_store(self, timeout_s: float) -> tuple[str, int]:
        """Host a world's store on this node's address: ``(address, port)``."""
        dist = require("torch.distributed", "torch", package="torch")
        store = dist.TCPStore(self.node_ip, 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
        with self._lock:
            self._stores[int(store.port)] = store
        return self.node_ip, int(store.port)

    def drop_store(self, port: int) -> None:
        with self._lock:
            self._stores.pop(port, None)

    # -- ranks ---------------------------------------------------------------------------
    def network_env(self, backend: str) -> dict[str, str]:
        if backend != "gloo" or "GLOO_SOCKET_IFNAME" in os.environ:
            return {}
        name = interface_of(self.node_ip)
        return {"GLOO_SOCKET_IFNAME": name} if name else {}

    def launch(self, entry: str, argv: list[str], env: dict[str, str], log: str, sys_path: Sequence[str] = ()) -> int:
        """Fork one rank on this machine, with the driver's ``sys.path``
        entries that exist here ahead of the node's own; its pid."""
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        proc = zygote(self.preload).launch(entry, argv, env, log,
                                           sys_path=[p for p in sys_path if os.path.exists(p)])
        with self._lock:
            self._procs[proc.pid] = proc
        return proc.pid

    def exit_codes(self, pids: Sequence[int]) -> dict[int, int | None]:
        """Each pid's exit code (None while it runs); -9 for one this agent
        does not know, or whose fork server is gone: its exit code will never
        come (the fork server's ranks die with it), and a world that waited
        for one would wait for its stall timeout (a profile's: half an hour)."""
        with self._lock:
            procs = dict(self._procs)
        out: dict[int, int | None] = {}
        for pid in pids:
            proc = procs.get(pid)
            if proc is None or (proc.exitcode is None and not proc.server_alive):
                out[pid] = LOST_CODE
            else:
                out[pid] = proc.exitcode
        return out

    def kill(self, pids: Sequence[int]) -> None:
        with self._lock:
            procs = [self._procs[p] for p in pids if p in self._procs]
        for proc in procs:
            proc.kill()

    def reap(self, pids: Sequence[int], timeout_s: float = 10.0) -> None:
        """Wait (at most `timeout_s`) for the ranks to exit, then forget them."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            procs = [self._procs[p] for p in pids if p in self._procs]
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            for proc in procs:
                if proc.exitcode is not None:
                    self._procs.pop(proc.pid, None)
