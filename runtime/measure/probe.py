"""The allreduce grid probe (Srifty 4.2, "Dataset"): measure the bus bandwidth
of real ``torch.distributed`` allreduces over a grid of world sizes, buffer
sizes and numbers of concurrent transfers, as the training data of the learned
allreduce model (`thrifty.perfmodels.allreduce`).

For each world size ``n`` the probe starts a world of ``n`` worker
processes on this host (`thrifty.runtime.worlds.World`: forks of
the fork server, nothing of the caller's ``__main__`` re-imported), each with
one torch thread (gloo over 127.0.0.1 on CPU; NCCL with one GPU per rank when
CUDA is there). The parent holds the rendezvous store on an ephemeral port,
so no port is guessed, and the ranks report progress, results and failures
through that store. Every rank sweeps the same grid of cells ``(s, k)``: buffer sizes
``s`` geometric from `min_bytes` to `max_bytes` and concurrency
``k = 1..concurrency``. One measurement of a cell:

1. all ranks meet at a barrier;
2. each rank starts ``k`` asynchronous ``all_reduce`` of ``s`` bytes each
   (``k`` distinct float32 buffers) back to back, then waits for all ``k``;
3. the rank's wall time from after the barrier to the last completion (with a
   device synchronize on GPUs) is its time; the measured time ``t`` of the
   batch is the *largest* over ranks, since an allreduce is done only when
   its slowest rank is.

Each of the ``k`` transfers moves ``s`` bytes in the batch time ``t``, so the
row records the per-transfer bus bandwidth ``busbw = 2 s (n - 1) / (n t)``
(Srifty 4.2); ``k * busbw`` is the aggregate the machine sustained. Each cell
runs `warmup` unrecorded times, then `repeats` recorded times.

On a cluster (``thrifty probe-allreduce --cluster``) a `Placement` puts the
ranks of each world on machines: rank ``r`` on the ``r // g``-th machine
(``g`` GPUs per instance, local rank ``r % g``), through that world's launcher
(the Ray launcher of `thrifty.runtime.cluster`), so the probe measures
allreduces across machines as training runs them; the rendezvous store is on
rank 0's machine. The probe itself is the same.

Every wait is bounded: the process group has a per-operation timeout, the
parent kills a world whose workers stop reporting progress for
`stall_timeout_s`, and a worker that fails takes its world down at once
(`ProbeFailed`). Workers end with ``os._exit`` past their last collective,
without tearing the process group down (`RankChannel.finish_and_leave`):
CPU gloo workers sometimes abort at interpreter exit after
``destroy_process_group()``, or block in its destructors.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from thrifty.core.errors import ProblemError
from thrifty.core.io import atomic_write_text
from thrifty.core.optional import require
from thrifty.perfmodels.allreduce.table import PROBE_COLUMNS
from thrifty.perfmodels.bandwidth import bus_bandwidth_from_time
from thrifty.runtime.worlds import RankChannel, World, WorldFailed, join_world, resolve_backend, serve_rank
from thrifty.runtime.worlds import world_barrier

__all__ = [
    "PROBE_COLUMNS",
    "CPU_MAX_BYTES",
    "GPU_MAX_BYTES",
    "ProbeTarget",
    "ProbeConfig",
    "ProbeFailed",
    "buffer_sizes",
    "instances_for",
    "probe_allreduce",
    "Placement",
    "PROBE_PRELOAD",
    "probe_rows_to_csv",
    "write_probe_csv",
]


CPU_MAX_BYTES = 64 * 2**20
GPU_MAX_BYTES = 512 * 2**20
_ELEMENT_BYTES = 4  # float32 buffers: sizes are multiples of 4 bytes

PROBE_PRELOAD = ("thrifty.runtime.measure.probe",)  # what a probe rank's fork server imports
ProgressCallback = Callable[[int, int, str], None]
# world size -> (the launcher of that world's ranks, each rank's extra environment)
Placement = Callable[[int], tuple[Any, Callable[[int], Mapping[str, str]]]]


class ProbeFailed(WorldFailed):
    """A probe world failed: a worker crashed, timed out or stopped reporting."""


@dataclass(frozen=True)
class ProbeTarget:
    """What the probed machine is, as recorded in every row: its catalog
    name, the device key of its workers, the provider's rated network and how
    many workers (GPUs) one instance runs."""

    instance_type: str
    device: str
    rated_network_gbps: float
    gpus_per_instance: int = 1

    def __post_init__(self) -> None:
        if not self.instance_type:
            raise ProblemError("instance_type is empty, but must name a catalog type")
        if self.gpus_per_instance < 1:
            raise ProblemError(f"gpus_per_instance is {self.gpus_per_instance}, but must be at least 1")
        if not (math.isfinite(self.rated_network_gbps) and self.rated_network_gbps >= 0):
            raise ProblemError(
                f"rated_network_gbps is {self.rated_network_gbps}, but must be a finite number >= 0"
            )


@dataclass(frozen=True)
class ProbeConfig:
    """The probe grid and its limits.

    `max_bytes` ``None`` means 64 MiB on CPU and 512 MiB on GPUs (Srifty
    sweeps 4 B to 512 MB); sizes grow by `size_factor` from `min_bytes`.
    `backend` ``"auto"`` picks NCCL when CUDA is available, else gloo.
    `op_timeout_s` bounds every collective and the rendezvous;
    `stall_timeout_s` is how long the parent waits for any sign of progress
    from a world before killing it.
    """

    world_sizes: tuple[int, ...]
    max_bytes: int | None = None
    min_bytes: int = 4
    size_factor: int = 2
    repeats: int = 5
    warmup: int = 1
    concurrency: int = 4
    backend: str = "auto"
    load_ms: float = 0.0
    op_timeout_s: float = 120.0
    stall_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.world_sizes:
            raise ProblemError("world_sizes is empty, but must list at least one world size")
        for n in self.world_sizes:
            if int(n) != n or n < 2:
                raise ProblemError(f"world size {n} is not allowed: an allreduce needs an integer world size >= 2")
        _at_least("min_bytes", self.min_bytes, _ELEMENT_BYTES)
        if self.max_bytes is not None:
            _at_least("max_bytes", self.max_bytes, self.min_bytes)
        _at_least("size_factor", self.size_factor, 2)
        _at_least("repeats", self.repeats, 1)
        _at_least("warmup", self.warmup, 0)
        _at_least("concurrency", self.concurrency, 1)
        if not (math.isfinite(self.load_ms) and self.load_ms >= 0):
            raise ProblemError(f"load_ms is {self.load_ms}, but must be a finite number >= 0")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ProblemError(f"backend is '{self.backend}', but must be 'auto', 'gloo' or 'nccl'")
        if not (self.op_timeout_s > 0 and self.stall_timeout_s > 0):
            raise ProblemError("op_timeout_s and stall_timeout_s must be positive")


def _at_least(name: str, value: int, low: int) -> None:
    if int(value) != value or value < low:
        raise ProblemError(f"{name} is {value}, but must be an integer >= {low}")


# -- the grid ------------------------------------------------------------------


def buffer_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Geometric buffer sizes from `min_bytes` up to `max_bytes` (both kept),
    each rounded down to whole float32 elements."""
    if min_bytes < _ELEMENT_BYTES or max_bytes < min_bytes or factor < 2:
        raise ProblemError(
            f"buffer sizes need 4 <= min_bytes <= max_bytes and factor >= 2 "
            f"(given {min_bytes}, {max_bytes}, {factor})"
        )
    sizes, s = [], min_bytes
    while s < max_bytes:
        sizes.append(s)
        s *= factor
    sizes.append(max_bytes)
    rounded = (s - s % _ELEMENT_BYTES for s in sizes)
    return sorted(set(rounded))


def grid_cells(sizes: Sequence[int], concurrency: int) -> list[tuple[int, int]]:
    """The cells ``(buffer_bytes, concurrent)`` every rank sweeps, in order."""
    return [(s, k) for s in sizes for k in range(1, concurrency + 1)]


def instances_for(world_size: int, gpus_per_instance: int) -> int:
    """How many instances a world of `world_size` workers spans when each
    instance runs `gpus_per_instance` workers (``local``: one per instance)."""
    return -(-world_size // gpus_per_instance)


def _import_torch() -> Any:
    require("torch.distributed", "torch", package="torch")
    return require("torch", "torch")


# -- the worker (one process per rank) -----------------------------------------


@dataclass(frozen=True)
class _WorkerPlan:
    backend: str
    cells: tuple[tuple[int, int], ...]
    repeats: int
    warmup: int
    op_timeout_s: float
    load_ms: float = 0.0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> "_WorkerPlan":
        data = json.loads(text)
        data["cells"] = tuple(tuple(c) for c in data["cells"])
        return cls(**data)


def _worker_entry(argv: list[str]) -> None:
    """Entry point of one probe rank (a `World` rank): rank 0 reports
    progress after each cell and, at the end, the result."""
    plan = _WorkerPlan.from_json(argv[0])
    serve_rank(lambda channel: _measure(plan, channel))


def _measure(plan: _WorkerPlan, channel: RankChannel) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    device = join_world(channel, plan.backend, plan.op_timeout_s)
    gpu = device.type == "cuda"

    def sync() -> None:
        if gpu:
            torch.cuda.synchronize(device)

    def barrier() -> None:
        world_barrier(device)

    load = _compute_load(torch, device, plan.load_ms / 1e3, sync)
    times: list[float] = []
    stamps: list[float] = []
    for done, (size, k) in enumerate(plan.cells, start=1):
        buffers = [torch.zeros(size // _ELEMENT_BYTES, dtype=torch.float32, device=device) for _ in range(k)]
        for r in range(plan.warmup + plan.repeats):
            barrier()
            load()
            sync()
            start = time.perf_counter()
            works = [dist.all_reduce(b, async_op=True) for b in buffers]
            for w in works:
                w.wait()
            sync()
            elapsed = time.perf_counter() - start
            if r >= plan.warmup:
                times.append(elapsed)
                stamps.append(time.time())
        del buffers
        if channel.rank == 0:
            channel.progress(done)

    # the batch is done when its slowest rank is: keep the max over ranks
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    barrier()
    channel.finish_and_leave({"times": slowest.cpu().tolist(), "stamps": stamps} if channel.rank == 0 else None)


def _compute_load(torch: Any, device: Any, seconds: float, sync: Callable[[], None]) -> Callable[[], None]:
    """A burst of `seconds` of computation (matrix products and a sweep over
    a 32 MiB buffer) that every rank runs between the barrier and a timed
    allreduce, as a DDP allreduce follows the backward pass: the transfer is
    measured with the caches, clocks and scheduler state that training
    leaves, not on idle ranks (on a shared CPU host, transfers after a burst
    of compute are measurably slower than back to back;
    `benchmarks/perfmodel_accuracy.py` shows the effect on predictions)."""
    if seconds <= 0:
        return lambda: None
    a = torch.randn(256, 256, device=device)
    sweep = torch.zeros(8 * 1024 * 1024, dtype=torch.float32, device=device)

    def burst() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            torch.mm(a, a)
            sweep.add_(1.0)
            sync()

    return burst


# -- the parent ----------------------------------------------------------------


def probe_allreduce(
    target: ProbeTarget,
    config: ProbeConfig,
    on_progress: ProgressCallback | None = None,
    placement: Placement | None = None,
) -> list[dict[str, Any]]:
    """Run the grid probe for every world size in `config`; return one row
    (a dict keyed by `PROBE_COLUMNS`) per recorded measurement.

    `on_progress(cells_done, cells_total, label)` is called as cells finish
    (over all world sizes). `placement` puts each world's ranks on a
    cluster's machines (default: processes of this host). Raises
    `ProbeFailed` when a world fails or stalls, `MissingDependencyError`
    without torch, `ProblemError` for a bad grid.
    """
    torch = _import_torch()
    if placement is None:
        backend = resolve_backend(config.backend)
    else:  # the ranks run on other machines: what this host has says nothing
        backend = config.backend if config.backend != "auto" else ("gloo" if target.device == "cpu" else "nccl")
    if backend == "nccl" and placement is None:
        gpus = torch.cuda.device_count()
        too_big = [n for n in config.world_sizes if n > gpus]
        if too_big:
            raise ProblemError(f"world sizes {too_big} need one GPU per rank, but this host has {gpus}")
    max_bytes = config.max_bytes or (GPU_MAX_BYTES if backend == "nccl" else CPU_MAX_BYTES)
    sizes = buffer_sizes(config.min_bytes, max_bytes, config.size_factor)
    cells = grid_cells(sizes, config.concurrency)
    total = len(cells) * len(config.world_sizes)
    rows: list[dict[str, Any]] = []
    for w, n in enumerate(config.world_sizes):

        def progress(done: int, n: int = n, offset: int = w * len(cells)) -> None:
            if on_progress is not None:
                on_progress(offset + done, total, f"world size {n}")

        times, stamps = _run_world(n, backend, cells, config, progress,
                                   placement(n) if placement is not None else None)
        rows += _rows_for_world(target, backend, n, cells, config.repeats, times, stamps)
    return rows


def _run_world(
    world_size: int,
    backend: str,
    cells: list[tuple[int, int]],
    config: ProbeConfig,
    progress: Callable[[int], None],
    placed: tuple[Any, Callable[[int], Mapping[str, str]]] | None = None,
) -> tuple[list[float], list[float]]:
    """Start the ranks of one world (on this host, or where `placed`'s
    launcher puts them, with its per-rank environment), follow them through
    the store, and return the (max over ranks) batch times and rank 0's
    timestamps."""
    launcher, rank_env = placed if placed is not None else (None, None)

    plan = _WorkerPlan(
        backend=backend,
        cells=tuple(cells),
        repeats=config.repeats,
        warmup=config.warmup,
        op_timeout_s=config.op_timeout_s,
        load_ms=config.load_ms,
    )
    world = World(world_size, "thrifty.runtime.measure.probe:_worker_entry", [plan.to_json()],
                  where=f"allreduce probe with world size {world_size}", backend=backend,
                  timeout_s=config.op_timeout_s, preload=PROBE_PRELOAD, launcher=launcher, rank_env=rank_env)
    result = world.run(stall_timeout_s=config.stall_timeout_s, on_progress=progress, failure=ProbeFailed)[0]
    return result["times"], result["stamps"]


def _rows_for_world(
    target: ProbeTarget,
    backend: str,
    world_size: int,
    cells: list[tuple[int, int]],
    repeats: int,
    times: list[float],
    stamps: list[float],
) -> list[dict[str, Any]]:
    expected = len(cells) * repeats
    if len(times) != expected or len(stamps) != expected:
        raise ProbeFailed(f"world size {world_size}: expected {expected} timings, got {len(times)}")
    instances = instances_for(world_size, target.gpus_per_instance)
    rows = []
    for i, seconds in enumerate(times):
        size, k = cells[i // repeats]
        rows.append(
            {
                "timestamp": _iso_utc(stamps[i]),
                "instance_type": target.instance_type,
                "device": target.device,
                "backend": backend,
                "rated_network_gbps": float(target.rated_network_gbps),
                "gpus_per_instance": target.gpus_per_instance,
                "instances": instances,
                "world_size": world_size,
                "buffer_bytes": size,
                "concurrent": k,
                "repeat": i % repeats,
                "seconds": float(seconds),
                "busbw_bytes_per_s": float(bus_bandwidth_from_time(size, world_size, seconds)),
            }
        )
    return rows


def _iso_utc(epoch_s: float) -> str:
    stamp = datetime.fromtimestamp(epoch_s, tz=timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# -- output --------------------------------------------------------------------


def probe_rows_to_csv(rows: Iterable[Mapping[str, Any]]) -> str:
    """CSV text of probe rows, columns in `PROBE_COLUMNS` order; floats are
    written with ``repr`` so that they read back exactly."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(PROBE_COLUMNS)
    for row in rows:
        writer.writerow([_cell(row[c]) for c in PROBE_COLUMNS])
    return out.getvalue()


def _cell(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def write_probe_csv(rows: Iterable[Mapping[str, Any]], path: str | Path) -> None:
    """Write probe rows to `path` atomically (all or nothing)."""
    atomic_write_text(path, probe_rows_to_csv(rows))
