"""Where a world's ranks run: the launcher contract, and the local launcher.

A `World` (`thrifty.runtime.worlds.world`) does everything that
does not depend on where its ranks run: the torchrun environment, the one
event protocol, timeouts, reaping. A launcher (`Launcher`) does the rest:

- `rendezvous(timeout_s)`: host the world's ``TCPStore`` where the ranks can
  reach it, and return its address (``MASTER_ADDR``, ``MASTER_PORT``) and a
  store handle for the starter (the master itself, or a client of it);
- `launch(rank, entry, argv, env, log)`: start rank `rank` as
  ``entry(argv)`` with `env` over the machine's environment, its output in
  `log`; returns a `RankProcess` (its exit code, whether its machine is
  known lost);
- `network_env(rank, backend)`: what the rank needs to find its network
  (``GLOO_SOCKET_IFNAME``);
- `settled(since)`: whether the exit codes it reports are no older than
  `since` on every machine (a remote launcher learns them with a delay);
- `hurry()`: the world is ending and its exits are awaited: learn them
  promptly from now on;
- `close()`: drop what the rendezvous holds.

`on_this_host` says whether the ranks are processes of this host and the
store is hosted by this process (a rank's pid can be signalled; a store that
fails is a bug, not a lost machine).

`LocalLauncher` runs every rank on this host, forked by this process's fork
server (`thrifty.runtime.worlds.zygote`), with the store hosted
here on 127.0.0.1 and gloo bound to the loopback interface. `RayLauncher`
(`thrifty.runtime.worlds.ray`) runs ranks on the machines of a Ray
cluster and hosts the store on rank 0's machine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from thrifty.runtime.worlds.network import loopback_interface
from thrifty.runtime.worlds.zygote import zygote

__all__ = ["Launcher", "RankProcess", "LocalLauncher"]


class RankProcess(Protocol):
    """A started rank, as its world watches it: `exitcode` is None while it
    runs (negative: killed by that signal); `server_alive` is False once
    whatever reports its exit is gone (no exit code will come any more);
    `machine_lost` is True once the launcher knows the rank's machine is
    gone (never, on this host)."""

    pid: int

    @property
    def exitcode(self) -> int | None: ...

    @property
    def server_alive(self) -> bool: ...

    @property
    def machine_lost(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float) -> None: ...


class Launcher(Protocol):
    """Where a world's ranks run (see the module docstring)."""

    @property
    def where(self) -> str:
        """Where the ranks run, for messages."""
        ...

    @property
    def on_this_host(self) -> bool:
        """The ranks are this host's processes and this process hosts the store."""
        ...

    def rendezvous(self, timeout_s: float) -> tuple[str, int, Any]: ...

    def launch(self, rank: int, entry: str, argv: list[str], env: dict[str, str], log: str) -> RankProcess: ...

    def network_env(self, rank: int, backend: str) -> dict[str, str]: ...

    def settled(self, since: float) -> bool: ...

    def hurry(self) -> None: ...

    def close(self) -> None: ...


class LocalLauncher:
    """Every rank on this host, forked by this process's fork server."""

    where = "this host"
    on_this_host = True

    def __init__(self, preload: Sequence[str] = ()):
        self.preload = tuple(preload)

    def rendezvous(self, timeout_s: float) -> tuple[str, int, Any]:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
        return "127.0.0.1", int(store.port), store

    def network_env(self, rank: int, backend: str) -> dict[str, str]:
        if backend != "gloo" or "GLOO_SOCKET_IFNAME" in os.environ:
            return {}
        lo = loopback_interface()
        return {"GLOO_SOCKET_IFNAME": lo} if lo else {}

    def launch(self, rank: int, entry: str, argv: list[str], env: dict[str, str], log: str) -> RankProcess:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        return zygote(self.preload).launch(entry, argv, env, log)

    def settled(self, since: float) -> bool:
        """Always: the fork server reports each exit as it happens."""
        return True

    def hurry(self) -> None:
        """Nothing to do: exits are reported as they happen."""

    def close(self) -> None:
        """Nothing to drop: the store goes with the world's handle on it."""
