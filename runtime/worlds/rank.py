"""One rank of a worker world, from the inside: the channel to the process
that started the world (`thrifty.runtime.worlds.world.World`).

The starter hosts the world's rendezvous store (a ``TCPStore`` on 127.0.0.1)
and gives each rank the torchrun environment (``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ...) plus
``THRIFTY_WORLD=1`` and ``THRIFTY_WORLD_TIMEOUT_S``. Ranks talk to it through
that store, in one protocol:

- events: JSON lines ``{"event": kind, "rank": r, "at": unix time, ...}``
  appended to one key (`post`); ``error`` (``message``, ``traceback``,
  ``peer`` when a collective broke because a peer left: `broken_by_peer`) and
  ``finished`` (``value``: the rank's result) are the kinds every world
  knows, its users add their own;
- progress: each rank's ``"<count> <unix time>"``, overwritten (`progress`):
  the starter's stall clock restarts when it moves;
- latest values: a JSON value per name, overwritten (`publish`), for reports
  the starter reads when it likes (clock marks);
- records: a sequence of JSON values per name (`send`), each under a key of
  its own (``thrifty/records/<name>/<n>``, n = 1, 2, ...) and then counted
  (``thrifty/records/<name>`` holds the last n), which the starter reads
  once each, in order, and deletes (`World.receive`): every flush of
  training metrics reaches it, without an ever-growing value;
- commands from the starter: a string per name (`command`, `wait_command`);
- barriers of the whole world through the store (`barrier`), for worlds
  without a process group.

A rank started outside a thrifty world (``torchrun``) has a channel without a
store: events at rank 0 go to its log, commands never come.

`serve_rank` runs a rank's body and ends the process: every failure is
reported as an ``error`` event (and logged), and the process leaves with
``os._exit``, because gloo can abort or block in interpreter teardown.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

__all__ = ["RankChannel", "CommandWatch", "serve_rank", "configure_logging", "join_world", "world_barrier",
           "KEY_EVENTS", "broken_by_peer", "progress_key", "latest_key", "records_key", "command_key",
           "DEFAULT_TIMEOUT_S", "leave", "STACKS_SIGNAL", "dump_stacks_on_signal"]

log = logging.getLogger(__name__)

KEY_EVENTS = "thrifty/events"
DEFAULT_TIMEOUT_S = 600.0


def progress_key(rank: int) -> str:
    return f"thrifty/progress/{rank}"


def latest_key(name: str) -> str:
    return f"thrifty/latest/{name}"


def records_key(name: str, n: int | None = None) -> str:
    """The count of the records sent under `name` (n None), or its record `n` (from 1)."""
    return f"thrifty/records/{name}" if n is None else f"thrifty/records/{name}/{n}"


def command_key(name: str) -> str:
    return f"thrifty/command/{name}"


class RankChannel:
    """This rank's side of the world's store (see the module docstring)."""

    def __init__(self, store: Any | None, rank: int, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.store, self.rank, self.world_size, self.timeout_s = store, rank, world_size, timeout_s
        self._sent: dict[str, int] = {}  # name -> records sent under it

    @classmethod
    def from_env(cls) -> "RankChannel":
        """The channel of a rank a `World` started; one without a store otherwise."""
        rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        timeout_s = float(os.environ.get("THRIFTY_WORLD_TIMEOUT_S", DEFAULT_TIMEOUT_S))
        if os.environ.get("THRIFTY_WORLD") != "1":
            return cls(None, rank, size, timeout_s)
        import torch.distributed as dist

        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                              timedelta(seconds=timeout_s))
        return cls(store, rank, size, timeout_s)

    def post(self, event: str, **data: Any) -> None:
        if self.store is not None:
            line = json.dumps({"event": event, "rank": self.rank, "at": time.time(), **data})
            self.store.append(KEY_EVENTS, line + "\n")
        elif self.rank == 0 and event != "error":
            log.info("%s: %s", event, data)

    def progress(self, done: int) -> None:
        if self.store is not None:
            self.store.set(progress_key(self.rank), f"{done} {time.time()!r}")

    def publish(self, name: str, value: Any) -> None:
        if self.store is not None:
            self.store.set(latest_key(name), json.dumps(value))
        elif self.rank == 0:
            log.info("%s: %s", name, value)

    def send(self, name: str, value: Any) -> None:
        """Add `value` (JSON) to the records under `name`: its own key first,
        then the count, so a starter that reads the count finds each record
        it counts. One rank sends under a name."""
        if self.store is not None:
            n = self._sent[name] = self._sent.get(name, 0) + 1
            self.store.set(records_key(name, n), json.dumps(value))
            self.store.set(records_key(name), str(n))
        elif self.rank == 0:
            log.info("%s: %s", name, value)

    def command(self, name: str) -> str | None:
        """The starter's command `name`, or None when it has not given it."""
        if self.store is None or not self.store.check([command_key(name)]):
            return None
        return self.store.get(command_key(name)).decode()

    def watch_command(self, name: str) -> "CommandWatch":
        """A watch on the starter's command `name`: a thread of this rank
        waits for it on a connection of its own, so that reading it
        (`CommandWatch.given`) costs no round trip to the starter's store."""
        return CommandWatch(self, name)

    def wait_command(self, name: str, timeout_s: float | None = None) -> str:
        """Wait (at most `timeout_s`, default the world's timeout) for the command `name`."""
        if self.store is None:
            raise RuntimeError("this rank was not started by a thrifty world: no commands come")
        self.store.wait([command_key(name)], timedelta(seconds=timeout_s or self.timeout_s))
        return self.store.get(command_key(name)).decode()

    def barrier(self, name: str) -> None:
        """Wait until every rank of the world has reached the barrier `name`
        (a fresh name per barrier)."""
        if self.store is None or self.world_size == 1:
            return
        key = f"thrifty/barrier/{name}"
        if self.store.add(key, 1) == self.world_size:
            self.store.set(key + "/open", "1")
        self.store.wait([key + "/open"], timedelta(seconds=self.timeout_s))

    def finish(self, value: Any) -> None:
        """Report this rank's result (any JSON value) to the starter."""
        self.post("finished", value=value)

    def finish_and_leave(self, value: Any) -> NoReturn:
        """Report this rank's result and end the process at once (``os._exit(0)``),
        before the caller's locals go away. Call it past the rank's last
        collective (after a barrier). Tearing down DDP and gloo objects (a
        Reducer and its ProcessGroupGloo, by `destroy_process_group` or by a
        frame's locals being freed) has blocked for good at times on this
        host, after the work was done: measured with the stall's stack dump,
        rank 0 of a truth-loop world hung returning from its training
        function, in C++ destructors, once in 34 runs (a Reducer freeing its
        group with the GIL held: `leave_group` says how). A rank has nothing
        left to clean up."""
        self.finish(value)
        leave()


def leave() -> NoReturn:
    """End this rank's process now (``os._exit(0)``), its output flushed,
    without tearing anything down (see `RankChannel.finish_and_leave`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class CommandWatch:
    """The starter's command `name`, watched by a daemon thread blocked on
    the store (its own clone of the channel's connection, which a thread may
    use beside the channel's): `given` is the command once it came, else
    None, read locally. It comes within the time that thread takes to wake
    after the starter gives it. A channel without a store (torchrun), a
    store that cannot be cloned, or a watch whose connection broke, reads the
    command at each `given` instead (one round trip)."""

    def __init__(self, channel: RankChannel, name: str):
        import threading

        self.channel, self.name = channel, name
        self._given: str | None = None
        clone = getattr(channel.store, "clone", None)
        self._store = None
        if clone is not None:
            try:
                self._store = clone()
            except Exception:  # noqa: BLE001 - a store that cannot be cloned is read at each look
                self._store = None
        if self._store is not None:
            threading.Thread(target=self._watch, name=f"thrifty-command-{name}", daemon=True).start()

    @property
    def given(self) -> str | None:
        """The command, once the starter gave it; else None."""
        if self._given is None and self._store is None:
            self._given = self.channel.command(self.name)
        return self._given

    def _watch(self) -> None:
        import torch.distributed as dist

        assert self._store is not None
        key = command_key(self.name)
        while True:
            try:
                self._store.wait([key], timedelta(seconds=self.channel.timeout_s))
                self._given = self._store.get(key).decode()
                return
            except dist.DistStoreError:  # the wait timed out: wait again
                continue
            except Exception:  # noqa: BLE001 - the connection broke: `given` reads the channel's store instead
                self._store = None
                return


def configure_logging(rank: int) -> None:
    """Worker log lines on stderr (the worker's log file), stamped with the rank,
    unless the process already configured logging."""
    if not logging.getLogger().handlers:
        logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                            format=f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s")


STACKS_SIGNAL = signal.SIGUSR1  # a rank writes every thread's stack to its log (stderr) on this signal


def dump_stacks_on_signal() -> None:
    """On `STACKS_SIGNAL`, write every thread's Python stack to stderr (the
    rank's log) and go on: what a starter asks for before it stops a world
    that stalled, so the failure says where each rank was."""
    try:
        faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
    except (AttributeError, ValueError, OSError):  # no such signal here, or stderr has no file descriptor
        pass


def serve_rank(body: Callable[[RankChannel], Any]) -> NoReturn:
    """Run one rank: ``body(channel)``, then end the process with ``os._exit``
    (0; 1 after reporting an ``error`` event when `body` raised; argparse's
    code on ``SystemExit``). Never returns."""
    rank = int(os.environ.get("RANK", "0"))
    configure_logging(rank)
    dump_stacks_on_signal()
    channel = RankChannel(None, rank, int(os.environ.get("WORLD_SIZE", "1")))
    code = 0
    try:
        channel = RankChannel.from_env()
        body(channel)
    except SystemExit as e:  # argparse
        code = e.code if isinstance(e.code, int) else 2
    except BaseException as e:  # noqa: BLE001 - report anything; the starter decides
        code = 1
        text = traceback.format_exc()
        log.error("failed:\n%s", text)
        try:
            channel.post("error", message=f"{type(e).__name__}: {e}", traceback=text,
                         **({"peer": True} if broken_by_peer(e) else {}))
        except Exception:  # noqa: BLE001 - the starter also sees the exit code
            pass
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# what a collective raises on a rank whose peer left the world (gloo's TCP pairs, NCCL's watchdog)
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "remote process exited")


def broken_by_peer(error: BaseException) -> bool:
    """Did `error` (or what caused it) come from a collective broken by a peer
    that left the world? Such an error follows from its peer's own failure,
    which is the one to report (`thrifty.runtime.worlds.watch`'s `Failed`)."""
    seen: BaseException | None = error
    while seen is not None:
        if any(text in str(seen) for text in _PEER_GONE):
            return True
        seen = seen.__cause__
    return False


def join_world(channel: RankChannel, backend: str, timeout_s: float | None = None) -> Any:
    """Join the world's process group through its store (every collective
    bounded by `timeout_s`, default the world's); return this rank's torch
    device (``cuda:LOCAL_RANK`` under NCCL, one GPU per rank, else the CPU)."""
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", channel.rank))
    gpu = backend == "nccl"
    if gpu:
        torch.cuda.set_device(local_rank)
    timeout = timedelta(seconds=timeout_s or channel.timeout_s)
    if channel.store is not None:
        dist.init_process_group(backend, store=channel.store, rank=channel.rank, world_size=channel.world_size,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    return torch.device("cuda", local_rank) if gpu else torch.device("cpu")


_KEPT_GROUPS: list[Any] = []


def leave_group() -> bool:
    """Destroy the default process group so that no DDP Reducer frees it.
    Return whether the group was freed here (else it is kept, for good, in
    this module). Drop the DDP models first: a model still alive keeps the
    group alive.

    Why: a Reducer holds its group. When the Reducer is the group's last owner,
    freeing it (a DDP model's dict going, with the GIL held) runs
    ``~ProcessGroupGloo``, which joins gloo's worker threads. A worker that has
    just run an all-reduce frees it, and the work's thread-local state holds a
    Python object, so that worker waits for the GIL: a deadlock, seen as a
    hung profile (``_ddp_overhead``) in CI and reproduced on this host (one
    process making a group, a DDP model and three backward passes, then
    ``destroy_process_group()`` with the model alive: hung within 300 rounds;
    the model freed first: 1,000 rounds, no hang). The group's own Python
    object frees it with the GIL released (torch binds it so). So the DDP
    models go first (a garbage collection frees those left in reference
    cycles), then the group. A DDP model on the group still alive after that
    (a job that keeps its model) would free the group with the GIL held: the
    group is kept instead, so that its Reducer is never the last owner. The
    collection and the search for live models take about 0.2 s."""
    import gc

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    gc.collect()
    group = dist.group.WORLD
    # by type, not isinstance: DDP's ABC check would read every object's __class__ (a deprecated one warns)
    alive = any(DistributedDataParallel in type(o).__mro__ and o.process_group is group for o in gc.get_objects())
    dist.destroy_process_group()
    if alive:
        _KEPT_GROUPS.append(group)
    return not alive


def world_barrier(device: Any) -> None:
    """A barrier of the whole process group (NCCL needs to be told this rank's GPU)."""
    import torch.distributed as dist

    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()
