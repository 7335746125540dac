"""A world of worker processes on this host, seen from the process that
starts it: the one way thrifty starts workers (training worlds, tuning
trials, the profiler's co-located and DDP-overhead workers, the allreduce
probe and the scaling profiler).

`World` has its launcher (`thrifty.runtime.worlds.launcher`) host
the rendezvous store (a ``TCPStore`` on an ephemeral port, so no port can be
raced for: on 127.0.0.1 here by default, on rank 0's machine on a cluster)
and start one process per rank: by default the local fork server (`zygote`;
torch is imported once and each rank is a fork), with the torchrun environment
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``TORCHELASTIC_USE_AGENT_STORE``, as
torchrun's agent sets them), ``THRIFTY_WORLD=1``, the world's timeout, the
thread count and, under gloo, the interface to bind (`Launcher.network_env`). Each rank calls
``entry(argv)`` (``module:function``), which hands its work to
`thrifty.runtime.worlds.rank.serve_rank`; the ranks speak the one
protocol of `thrifty.runtime.worlds.rank`.

Watching is by polling, never blocking: `events` (new events), `progress`,
`latest`, `receive` (new records, each once), `exit_codes`, read by the one
watcher (`thrifty.runtime.worlds.watch.Watch`), whose looks end in a typed
outcome. `run` is the whole life of a world that computes a result: it follows
the ranks until their outcome, calls back on progress, and raises
`WorldFailed` (or the caller's error type), naming the world, when a rank
reports an error, dies, goes without progress for the stall timeout, or ends
without its result. Every process dies with the fork server, which dies with
this process (``PR_SET_PDEATHSIG`` on Linux), and `close` kills and reaps
whatever still runs.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from thrifty.runtime.worlds.errors import WorldFailed
from thrifty.runtime.worlds.launcher import Launcher, LocalLauncher, RankProcess
from thrifty.runtime.worlds.rank import KEY_EVENTS, DEFAULT_TIMEOUT_S, STACKS_SIGNAL, command_key
from thrifty.runtime.worlds.rank import latest_key, progress_key, records_key
from thrifty.runtime.worlds.watch import Failed, Finished, Killed, Lost, Outcome, ServerGone, Stalled, Watch

__all__ = ["World", "POLL_S"]

POLL_S = 0.05
ERROR_GRACE_S = 1.0  # after an error event, how long to wait for the rank's exit before raising


class World:
    """`size` ranks, each ``entry(argv_of(rank))`` in a process of its own.

    argv: the argument list of every rank, or a function of the rank.
    logs: the log file of a rank (its stdout and stderr), a function of the
        rank; by default ``<temp dir>/thrifty-world-<pid>-<n>-rank<r>.log``.
    env: extra environment of every rank; `rank_env` of one rank (it may
        override the torchrun variables, e.g. ``LOCAL_RANK`` and ``GROUP_RANK``
        of multi-machine layouts).
    preload: modules the fork server imports before forking (the ranks'
        entry module, the user's trainer module), so a rank starts warm.
    where: what the world is, for error messages.
    launcher: where the ranks run (default: `LocalLauncher`, this host).
    """

    _count = 0

    def __init__(self, size: int, entry: str, argv: Sequence[str] | Callable[[int], Sequence[str]] = (), *,
                 where: str = "a worker world", logs: Callable[[int], str | Path] | None = None,
                 env: Mapping[str, str] | None = None, rank_env: Callable[[int], Mapping[str, str]] | None = None,
                 backend: str = "gloo", threads: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S,
                 preload: Sequence[str] = (), launcher: Launcher | None = None):
        if size < 1:
            raise ValueError(f"a world needs at least one rank, not {size}")
        World._count += 1
        self.size, self.entry, self.where = size, entry, where
        self._argv = argv if callable(argv) else (lambda _rank, a=list(argv): a)
        default = Path(os.environ.get("TMPDIR", "/tmp")) / f"thrifty-world-{os.getpid()}-{World._count}"
        self._logs = logs or (lambda rank: f"{default}-rank{rank}.log")
        self.env, self.rank_env = dict(env or {}), rank_env
        self.backend, self.threads, self.timeout_s = backend, threads, timeout_s
        self.preload = tuple(preload)
        self.launcher: Launcher = launcher if launcher is not None else LocalLauncher(self.preload)
        self.store: Any = None
        self.master: tuple[str, int] | None = None
        self.store_failed: str | None = None
        self.procs: list[RankProcess] = []
        self.started_at: float | None = None  # monotonic
        self._consumed = 0
        self._latest: dict[str, str] = {}
        self._received: dict[str, int] = {}  # name -> records received under it (`receive`)
        self._closed = False

    # -- life cycle -------------------------------------------------------------------------
    def log_path(self, rank: int) -> Path:
        return Path(self._logs(rank))

    @property
    def port(self) -> int:
        assert self.master is not None, "the world has not started"
        return self.master[1]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> "World":
        address, port, self.store = self.launcher.rendezvous(self.timeout_s)
        self.master = (address, port)
        self.store.set(KEY_EVENTS, "")
        base = {"MASTER_ADDR": address, "MASTER_PORT": str(port), "WORLD_SIZE": str(self.size),
                "LOCAL_WORLD_SIZE": str(self.size), "GROUP_RANK": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
                "THRIFTY_WORLD": "1", "THRIFTY_WORLD_TIMEOUT_S": repr(float(self.timeout_s)),
                "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}
        self.started_at = time.monotonic()
        for rank in range(self.size):
            env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank),
                   **self.launcher.network_env(rank, self.backend), **self.env,
                   **(self.rank_env(rank) if self.rank_env else {})}
            self.procs.append(self.launcher.launch(rank, self.entry, list(self._argv(rank)), env,
                                                   str(self.log_path(rank))))
        return self

    def _stacks_of_stalled(self, wait_s: float = 1.0, lines: int = 12) -> str:
        """Ask every rank still running on this host for its threads' stacks
        (`rank.STACKS_SIGNAL`, written to its log) and return the end of each
        log, so a stall says where the ranks were ("" on other launchers)."""
        if not self.launcher.on_this_host:
            return ""
        running = [(rank, proc) for rank, proc in enumerate(self.procs) if proc.exitcode is None]
        for _, proc in running:
            try:
                os.kill(proc.pid, STACKS_SIGNAL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(wait_s)
        out = []
        for rank, _ in running:
            try:
                tail = self.log_path(rank).read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            out.append(f"\nrank {rank} ({self.log_path(rank)}), last lines:\n" + "\n".join(tail))
        return "".join(out)

    def kill(self, ranks: Sequence[int] | None = None) -> None:
        """SIGKILL the given ranks (default: all) that still run."""
        self.hurry()
        for rank, proc in enumerate(self.procs):
            if (ranks is None or rank in ranks) and proc.exitcode is None:
                proc.kill()

    def close(self, grace_s: float = 0.0) -> None:
        """Give the ranks `grace_s` to exit, kill the rest, reap every process,
        drop the store."""
        if self._closed:
            return
        limit = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(timeout=max(0.0, limit - time.monotonic()))
        self.kill()
        for proc in self.procs:
            proc.join(timeout=10.0)
        self._closed = True
        self.store = None
        self.launcher.close()

    def __enter__(self) -> "World":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- watching -----------------------------------------------------------------------------
    def _read(self, key: str) -> str | None:
        """The store's value under `key` (None when absent). A store that
        cannot be reached any more (its host went down with rank 0's machine
        on a cluster) reads as empty and sets `store_failed`; the ranks' exit
        codes then say what happened."""
        return self._ask(lambda store: store.get(key).decode("utf-8", errors="replace")
                         if store.check([key]) else None)

    def _ask(self, question: Callable[[Any], Any]) -> Any:
        """`question(store)`, or None when the store cannot be reached (see `_read`)."""
        if self.store_failed is not None:
            return None
        try:
            return question(self.store)
        except Exception as e:  # noqa: BLE001 - torch raises DistStoreError, RuntimeError or OSError
            if self.launcher.on_this_host:
                raise  # hosted by this process: a failure is a bug, not a lost machine
            self.store_failed = f"{type(e).__name__}: {e}"
            return None

    def events(self) -> list[dict[str, Any]]:
        """The events the ranks posted since the last call."""
        text = self._read(KEY_EVENTS) or ""
        fresh, self._consumed = text[self._consumed:], max(self._consumed, len(text))
        return [json.loads(line) for line in fresh.splitlines() if line.strip()]

    def progress(self, rank: int = 0) -> tuple[int, float] | None:
        """``(count, unix time)`` of the rank's last progress report, or None."""
        text = self._read(progress_key(rank))
        if text is None:
            return None
        done, at = text.split()
        return int(done), float(at)

    def latest(self, name: str) -> Any | None:
        """The value published under `name` when it changed since the last call, else None."""
        text = self._read(latest_key(name))
        if text is None:
            return None
        if text == self._latest.get(name):
            return None
        self._latest[name] = text
        return json.loads(text)

    def receive(self, name: str) -> list[Any]:
        """The records the ranks sent under `name` (`RankChannel.send`) since
        the last call, in the order sent, each once: each is deleted from the
        store once read, so the store holds only what is not read yet."""
        count = self._read(records_key(name))
        out: list[Any] = []
        for n in range(self._received.get(name, 0) + 1, int(count or 0) + 1):
            text = self._ask(functools.partial(_take, key=records_key(name, n)))
            if text is None:  # the store is gone: what it held went with it
                break
            out.append(json.loads(text))
            self._received[name] = n
        return out

    def command(self, name: str, value: str = "1") -> None:
        """Give the ranks the command `name` (they read it with `RankChannel.command`)."""
        if self.store_failed is None:
            self.store.set(command_key(name), value)

    def exit_codes(self) -> list[int | None]:
        return [p.exitcode for p in self.procs]

    @property
    def server_alive(self) -> bool:
        """False once the fork server is gone: no exit code will come any more."""
        return all(p.server_alive for p in self.procs)

    # -- a world that computes a result ---------------------------------------------------------
    def run(self, *, stall_timeout_s: float, on_progress: Callable[[int], None] | None = None,
            on_wait: Callable[[], None] | None = None, failure: type[Exception] = WorldFailed) -> list[Any]:
        """Start the world (unless started), follow it to its end and return
        every rank's ``finished`` value, by rank. ``on_progress(total)`` is
        called when the sum of the ranks' progress counts moves; `on_wait`
        while waiting. Raises `failure` naming the world (see the module
        docstring) on any outcome of its `Watch` but a finished one with every
        result; the processes are always reaped."""
        if self.store is None:
            self.start()
        def on_event(event: dict[str, Any]) -> None:
            if event["event"] == "finished":
                watch.sign()

        watch = Watch(self, error_grace_s=ERROR_GRACE_S, stall_timeout_s=stall_timeout_s,
                      progress_ranks=range(self.size), on_event=on_event)
        total = -1
        try:
            while True:
                look = watch.look()
                now_total = sum(count for count, _ in watch.progress.values())
                if now_total != total:
                    total = now_total
                    if on_progress is not None:
                        on_progress(total)
                if look.outcome is not None:
                    return self._result(look.outcome, failure, stall_timeout_s)
                if on_wait is not None:
                    on_wait()
                time.sleep(POLL_S)
        finally:
            self.close(grace_s=10.0 if len(watch.results) == self.size else 0.0)

    def _result(self, outcome: Outcome, failure: type[Exception], stall_timeout_s: float) -> list[Any]:
        """The results of a finished world, or `failure` saying how it ended."""
        match outcome:
            case Finished(results=results):
                missing = [r for r in range(self.size) if r not in results]
                if missing:
                    raise failure(f"{self.where}: the workers exited without a result "
                                  f"(ranks {', '.join(map(str, missing))})")
                return [results[r] for r in range(self.size)]
            case Failed(rank=rank, reason=reason, details=details):
                raise failure(f"{self.where}: rank {rank} failed:\n{details or reason}".rstrip())
            case Lost(ranks=lost):
                died = ", ".join(f"rank {r} exit code {c}" for r, c in lost)
                raise failure(f"{self.where}: a worker died ({died}; log: {self.log_path(lost[0][0])})")
            case ServerGone():
                raise failure(f"{self.where}: the worker fork server exited while workers ran")
            case Stalled():
                raise failure(f"{self.where}: no progress for {stall_timeout_s:g} s; "
                              "stopped the workers" + self._stacks_of_stalled())
            case Killed():
                raise failure(f"{self.where}: the workers were killed")
        raise AssertionError(f"unknown outcome {outcome!r}")

    def settled(self, since: float) -> bool:
        """Whether the exit codes are known as of `since` (monotonic) on every
        machine (always, on this host)."""
        return self.launcher.settled(since)

    def machines_lost(self) -> list[int]:
        """Ranks whose machine the launcher knows is gone (never, on this host)."""
        return [r for r, p in enumerate(self.procs) if p.machine_lost]

    def hurry(self) -> None:
        """The world is ending: its exits will be awaited. A launcher that
        watches remote exits less often while a world trains (the Ray one)
        watches them closely from now on."""
        self.launcher.hurry()


def _take(store: Any, key: str) -> bytes:
    """The store's value under `key` (which is there), deleted as it is read."""
    value = store.get(key)
    store.delete_key(key)
    return value
