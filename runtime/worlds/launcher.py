"""Where a world's ranks run: the launcher contract, and the local launcher.

A `World` (`thrifty.runtime.worlds.world`) does everything that
does not depend on where its ranks run: the torchrun environment, the one
event protocol, timeouts, reaping. A launcher does the rest, in four calls:

- `rendezvous(timeout_s)`: host the world's ``TCPStore`` where the ranks can
  reach it, and return its address (``MASTER_ADDR``, ``MASTER_PORT``) and a
  store handle for the starter (the master itself, or a client of it);
- `launch(rank, entry, argv, env, log, files)`: start rank `rank` as
  ``entry(argv)`` with `env` over the machine's environment, its output in
  `log`, and `files` (path -> text) present on its machine; returns a
  `RankProcess`;
- `network_env(rank, backend)`: what the rank needs to find its network
  (``GLOO_SOCKET_IFNAME``);
- `close()`: drop what the rendezvous holds.

`LocalLauncher` runs every rank on this host, forked by this process's fork
server (`thrifty.runtime.worlds.zygote`), with the store hosted
here on 127.0.0.1 and gloo bound to the loopback interface. The Ray launcher
(`thrifty.runtime.cluster.launcher`) runs ranks on the machines of a Ray
cluster and hosts the store on rank 0's machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from thrifty.runtime.worlds.network import loopback_interface
from thrifty.runtime.worlds.zygote import zygote

__all__ = ["Launcher", "RankProcess", "LocalLauncher", "write_files"]


class RankProcess(Protocol):
    """A started rank, as its world watches it: `exitcode` is None while it
    runs (negative: killed by that signal); `server_alive` is False once
    whatever reports its exit is gone (no exit code will come any more)."""

    pid: int

    @property
    def exitcode(self) -> int | None: ...

    @property
    def server_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float) -> None: ...


class Launcher(Protocol):
    where: str  # where the ranks run, for messages

    def rendezvous(self, timeout_s: float) -> tuple[str, int, Any]: ...

    def launch(self, rank: int, entry: str, argv: list[str], env: dict[str, str], log: str,
               files: Mapping[str, str]) -> RankProcess: ...

    def network_env(self, rank: int, backend: str) -> dict[str, str]: ...

    def close(self) -> None: ...


def write_files(files: Mapping[str, str]) -> None:
    """Make `files` (path -> text) present on this machine: written when
    absent or different (a machine that shares the starter's file system
    already has them)."""
    for path, text in files.items():
        target = Path(path)
        try:
            if target.read_text() == text:
                continue
        except OSError:
            pass
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        temp.write_text(text)
        os.replace(temp, target)


class LocalLauncher:
    """Every rank on this host, forked by this process's fork server."""

    where = "this host"

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

    def launch(self, rank: int, entry: str, argv: list[str], env: dict[str, str], log: str,
               files: Mapping[str, str]) -> RankProcess:
        write_files(files)
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        return zygote(self.preload).launch(entry, argv, env, log)

    def close(self) -> None:
        pass
