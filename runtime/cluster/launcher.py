"""`RayLauncher`: a world's ranks on the machines of a Ray cluster.

The `thrifty.runtime.worlds.launcher.Launcher` of worlds whose
ranks run on Ray nodes: rank r runs on the machine of `agents[r]` (a
`thrifty.runtime.cluster.agent.MachineAgent` actor), forked there by that
machine's fork server; the rendezvous store is hosted by rank 0's agent on
its node's address (``MASTER_ADDR``), and this process is a client of it.

Watching never blocks: exit codes come from one ``exit_codes`` call per
agent in flight at a time, collected with ``ray.wait(timeout=0)``. An agent
whose call fails with ``RayActorError`` (its node died, or it was killed) has
lost its ranks: they report exit code -9, as a machine taken away without
notice does under the local launcher, and `machine_lost` says so.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["RayLauncher", "RayRankProcess"]

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

    def __init__(self, agents: Sequence[Any]):
        import ray

        self._ray = ray
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
        import torch.distributed as dist
        from datetime import timedelta

        owner = self._index[0]
        address, port = self._ray.get(self._unique[owner].host_store.remote(timeout_s), timeout=timeout_s)
        self._store = (owner, port)
        client = dist.TCPStore(address, port, None, False, timedelta(seconds=timeout_s))
        return address, port, client

    def network_env(self, rank: int, backend: str) -> dict[str, str]:
        return self._ray.get(self.agents[rank].network_env.remote(backend), timeout=60)

    def launch(self, rank: int, entry: str, argv: list[str], env: dict[str, str], log: str,
               files: Mapping[str, str]) -> RayRankProcess:
        pid = self._ray.get(self.agents[rank].launch.remote(entry, argv, env, log, dict(files), list(sys.path)),
                            timeout=120)
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
        that the ranks beside them need (a measurable share of the iteration
        time on a host with few cores), so rounds are rarer then."""
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
