"""Measure a compute profile on the local device (Srifty 4.1).

`profile_workload` runs real training iterations of a `Workload` and records,
per local batch size, the forward and backward latency (mean and standard
deviation over repeats, after warm-up), the optimizer step, the largest batch
that fits, and when each parameter's gradient becomes ready in the backward
pass. The result is a `ComputeProfile` (``thrifty.compute_profile/1``).

Two kinds of repeats, because hooks cost time:

* latency repeats run without hooks: forward (model and loss), backward, and
  ``optimizer.step()`` + ``zero_grad()`` are timed separately, each batch's
  repeats split over a few passes over the sweep (so that noise from other
  work on the machine spreads over every batch size), each pass after warm-up;
* DDP's overhead (given the workload's factory spec, as the CLI does): in a
  worker process (a world of `thrifty.runtime.worlds`), DDP on a world of one against the plain model, iterations
  interleaved in pairs at the trace's batch (``ddp_overhead_s``);
* readiness repeats, at one reference batch, run with a
  ``register_post_accumulate_grad_hook`` on every parameter. Each hook's
  timestamp, relative to the backward start and divided by that backward's
  duration, is that gradient's ``ready_frac`` (averaged over repeats); Srifty
  normalizes so that the trace scales to other batch sizes.

Co-located workers (CPU): with ``colocated=k`` the latency sweep is measured
a second time in ``k`` fresh processes at once (a worker world, each loading the
workload from its factory spec, one barrier before every batch so that all
of them run the same batch together, and a real gradient exchange between
backward and the step of every iteration, untimed, as DDP's; see
`thrifty.runtime.measure.colocated`) and kept as the profile's
``colocated`` points: what one of ``k`` worker processes sharing the host's
cores sees. The pooled samples of all ``k`` give each point.

Devices: on CPU the run uses ``torch.set_num_threads(threads)`` and
``max_batch`` is the largest batch swept, or, given a memory limit, an
estimate from the saved activations (`estimate_max_batch`). On CUDA every
timestamp is a CUDA event after ``torch.cuda.synchronize()``, and ``max_batch``
comes from a doubling-then-bisection search for the largest batch whose
iteration does not run out of memory.

The workload's model is copied before it is trained, so the caller's weights
are left as they were.

Workloads come from factories named ``package.module:function``
(`load_factory`, `load_workload`), which may return a `Workload`, a tuple
``(model, make_batch, loss_fn)`` or an object with those three attributes.

The phases live in modules beside this one: `workloads` (factories, device,
machine), `timing` (the timed trainer, latency and readiness), `memory` (the
largest batch), `colocated` (DDP overhead and co-located workers, in worker
processes) and `progress` (the bar); this module plans the sweep and puts the
profile together.
"""

from __future__ import annotations

import datetime as _dt
import gc
import math
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from thrifty.core.errors import ProblemError
from thrifty.runtime.worlds.allocator import settle as settle_allocator
from thrifty.runtime.measure.colocated import check_colocated, measure_colocated, measure_ddp_overhead
from thrifty.runtime.measure.memory import estimate_max_batch, iteration_fits, search_max_batch
from thrifty.runtime.measure.progress import progress_bar
from thrifty.runtime.measure.timing import (
    TimedTrainer,
    make_trainer,
    measure_readiness,
    measure_sweep,
    point,
    timed_without_gc,
)
from thrifty.runtime.measure.workloads import (
    as_workload,
    device_label,
    import_torch,
    load_factory,
    load_workload,
    machine_description,
    resolve_device,
)
from thrifty.perfmodels.profile import ComputeProfile, LayerGrad, Provenance

if TYPE_CHECKING:  # pragma: no cover
    from thrifty.runtime.measure.zoo import Workload

# the profiler's public API: its own functions and the phases it runs (modules beside it)
__all__ = [
    "make_trainer",
    "timed_without_gc",
    "DEFAULT_REPEATS",
    "DEFAULT_WARMUP",
    "DEFAULT_ROUNDS",
    "DEFAULT_CPU_MAX_BATCH",
    "DEFAULT_CUDA_MAX_BATCH",
    "geometric_batches",
    "load_factory",
    "load_workload",
    "as_workload",
    "resolve_device",
    "device_label",
    "machine_description",
    "search_max_batch",
    "estimate_max_batch",
    "profile_workload",
    "measure_colocated",
    "measure_ddp_overhead",
]

DEFAULT_REPEATS = 10
DEFAULT_WARMUP = 3
DEFAULT_ROUNDS = 3
DEFAULT_CPU_MAX_BATCH = 256
DEFAULT_CUDA_MAX_BATCH = 4096  # the OOM search stops here unless told otherwise
READY_BATCH_TARGET = 32  # the readiness trace is taken at the swept batch nearest this


# --- batches ------------------------------------------------------------------------


def geometric_batches(max_batch: int, start: int = 1) -> list[int]:
    """``start, 2*start, 4*start, ...`` up to `max_batch`, and `max_batch` itself."""
    if max_batch < 1 or start < 1:
        raise ProblemError(f"max_batch is {max_batch}, but must be at least 1")
    out = []
    batch = start
    while batch < max_batch:
        out.append(batch)
        batch *= 2
    out.append(max_batch)
    return out


def _checked_batches(batches: Sequence[int]) -> list[int]:
    out = sorted(set(batches))
    for batch in out:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ProblemError(f"batch {batch!r} is not a positive integer")
    if len(out) < 2:
        raise ProblemError(f"batches are {list(batches)}, but a profile needs two or more distinct batch sizes")
    return out


def _nearest_batch(batches: Sequence[int], target: int) -> int:
    # Nearest in log scale: 16 and 64 are equally far from 32.
    return min(batches, key=lambda b: (abs(math.log(b / target)), -b))


def _python_command(model_name: str, **settings: Any) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in settings.items() if v is not None)
    return f"thrifty.runtime.measure.profiler.profile_workload(workload, model_name={model_name!r}, {shown})"


# --- the profiler -------------------------------------------------------------------


def profile_workload(
    workload: "Workload | Any",
    *,
    model_name: str,
    batches: Sequence[int] | None = None,
    max_batch: int | None = None,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    rounds: int = DEFAULT_ROUNDS,
    threads: int = 1,
    device: str = "auto",
    ready_batch: int | None = None,
    ready_repeats: int | None = None,
    memory_limit_bytes: int | None = None,
    device_name: str | None = None,
    make_optimizer: Callable[[Any], Any] | None = None,
    command: str | None = None,
    progress: bool = True,
    colocated: int = 1,
    factory: str | None = None,
) -> ComputeProfile:
    """Measure `workload` on the local device and return its compute profile.

    batches: the batch sizes to time (two or more); by default ``1, 2, 4, ...``
        up to `max_batch` (default 256 on CPU; on CUDA the largest that fits,
        searched up to 4096). Give `batches` or `max_batch`, not both.
    repeats: timed iterations per batch size, taken in `rounds` passes over the
        sweep so that a burst of noise from elsewhere on the machine spreads
        over all batch sizes instead of skewing one; `warmup` untimed
        iterations precede each batch's timed ones in every pass.
    threads: ``torch.set_num_threads`` for the run (restored afterwards).
    device: ``auto``, ``cpu`` or ``cuda``; `device_name` overrides the profile's
        device key (default ``cpu`` or the GPU model, e.g. ``A100``).
    ready_batch, ready_repeats: where and how often the gradient-ready trace is
        taken (default: the swept batch nearest 32, `repeats` times).
    memory_limit_bytes: on CPU, cap `max_batch` by the estimated training
        memory (`estimate_max_batch`); the sweep stops below it.
    make_optimizer: ``params -> optimizer``; default SGD, momentum 0.9.
    command: the provenance command (the CLI passes its command line).
    factory: the workload's ``module:function`` spec: with it, processes
        started to measure DDP's overhead (and co-located workers) load the
        workload themselves; without it ``ddp_overhead_s`` is 0 (not measured).
    colocated: on CPU, also measure the sweep in this many processes at once
        (see the module docstring); needs `factory` and the default optimizer.
    """
    torch = import_torch()
    allocator = settle_allocator()  # as every worker runs (see thrifty.runtime.worlds.allocator)
    workload = as_workload(workload)
    _check_settings(batches, max_batch, repeats, warmup, rounds, threads, ready_repeats, memory_limit_bytes)
    resolved = resolve_device(device)
    check_colocated(colocated, factory, resolved, make_optimizer)
    ready_repeats = repeats if ready_repeats is None else ready_repeats
    rounds = min(rounds, repeats)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        trainer = make_trainer(torch, workload, resolved, make_optimizer)
        with progress_bar(progress) as bar:
            sweep, top, top_source = _plan_sweep(trainer, batches, max_batch, memory_limit_bytes, bar)
            ready_at = ready_batch if ready_batch is not None else _nearest_batch(sweep, READY_BATCH_TARGET)
            if ready_at > top:
                raise ProblemError(f"ready_batch {ready_at} is beyond the memory limit max_batch {top}")
            total = len(sweep) * (rounds * warmup + repeats) + 1 + ready_repeats
            task = bar.add_task(f"profiling {model_name}", total=total)

            def report(doing: str) -> Callable[[], None]:
                bar.update(task, description=f"profiling {model_name}: {doing}")
                return lambda: bar.advance(task)

            samples = measure_sweep(trainer, sweep, warmup, repeats, rounds, report)
            tick = report(f"gradient-ready trace at batch {ready_at}")
            ready, hooked_backward = timed_without_gc(
                lambda: measure_readiness(trainer, ready_at, ready_repeats, tick))
            ddp_s = 0.0
            if resolved == "cuda":
                _release_cached_gpu_memory(torch)
            if factory is not None:
                bar.update(task, description=f"profiling {model_name}: DDP overhead at batch {ready_at}")
                ddp_s = measure_ddp_overhead(factory, resolved, ready_at, warmup, repeats, threads)
            shared = None
            if colocated > 1:
                assert factory is not None  # check_colocated: co-located workers load it
                shared = measure_colocated(factory, sweep, colocated, warmup, repeats, rounds, threads, bar)
    finally:
        torch.set_num_threads(previous_threads)

    layers, unused = _layers(trainer.model, ready)
    extra: dict[str, Any] = {
        "threads": threads,
        "warmup": warmup,
        "rounds": rounds,
        "max_batch_source": top_source,
        "optimizer": _describe_optimizer(trainer.optimizer),
        "ready_batch": ready_at,
        "ready_repeats": ready_repeats,
        "allocator": allocator or "default",
    }
    if ready_at in samples:
        # How much the hooks slowed the backward pass; large values make the trace suspect.
        plain_backward = statistics.fmean(samples[ready_at].backward_s)
        extra["ready_hook_overhead_frac"] = round(statistics.fmean(hooked_backward) / plain_backward - 1.0, 4)
    if unused:
        extra["unused_parameters"] = unused
    if command is None:
        command = _python_command(
            model_name, batches=list(sweep), repeats=repeats, warmup=warmup, rounds=rounds, threads=threads,
            device=device
        )
    return ComputeProfile(
        model=model_name,
        device=device_name or device_label(resolved),
        provenance=Provenance(
            kind="measured",
            command=command,
            machine=machine_description(resolved, threads),
            date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        ),
        max_batch=top,
        step_s=statistics.fmean(v for s in samples.values() for v in s.step_s),
        points=[point(batch, s) for batch, s in samples.items()],
        layers=layers,
        buffer_bytes=sum(b.numel() * b.element_size() for b in trainer.model.buffers()),
        ddp_overhead_s=ddp_s,
        colocated=shared,
        extra=extra,
    )


def _release_cached_gpu_memory(torch: Any) -> None:
    """Hand back to the GPU the blocks this process's caching allocator kept
    from the sweep's largest batches. The DDP-overhead process runs on this
    same GPU: after a sweep up to the largest batch that fits, the cache holds
    nearly all of its memory, and that process would run out of it."""
    gc.collect()
    torch.cuda.empty_cache()


def _check_settings(
    batches: Sequence[int] | None,
    max_batch: int | None,
    repeats: int,
    warmup: int,
    rounds: int,
    threads: int,
    ready_repeats: int | None,
    memory_limit_bytes: int | None,
) -> None:
    if batches is not None and max_batch is not None:
        raise ProblemError("give either batches or max_batch, not both")
    for name, value, least in (
        ("repeats", repeats, 1),
        ("warmup", warmup, 0),
        ("rounds", rounds, 1),
        ("threads", threads, 1),
        ("ready_repeats", ready_repeats, 1),
        ("max_batch", max_batch, 1),
        ("memory_limit_bytes", memory_limit_bytes, 1),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
            raise ProblemError(f"{name} is {value!r}, but must be an integer of at least {least}")


def _plan_sweep(
    trainer: TimedTrainer,
    batches: Sequence[int] | None,
    max_batch: int | None,
    memory_limit_bytes: int | None,
    bar: Any,
) -> tuple[list[int], int, str]:
    """The batches to time, ``max_batch`` and where it came from."""
    if batches is not None:
        sweep = _checked_batches(batches)
        cap = sweep[-1]
    else:
        cap = max_batch or (DEFAULT_CUDA_MAX_BATCH if trainer.device == "cuda" else DEFAULT_CPU_MAX_BATCH)
        sweep = []
    if trainer.device == "cuda" and memory_limit_bytes is not None:
        raise ProblemError("a memory limit applies on CPU only; on CUDA the largest batch that fits is searched")
    if trainer.device == "cuda":
        task = bar.add_task("searching the largest batch that fits", total=None)
        found = search_max_batch(lambda b: iteration_fits(trainer, b), cap)
        bar.remove_task(task)
        if found is None:
            raise ProblemError("not even batch 1 fits in the GPU's memory")
        top, source = found, ("cap" if found == cap else "oom_search")
    elif memory_limit_bytes is not None:
        top, source = estimate_max_batch(trainer, memory_limit_bytes), "memory_estimate"
    else:
        top, source = cap, "swept"
    if not sweep:
        sweep = geometric_batches(min(cap, top))
    kept = [b for b in sweep if b <= top]
    if len(kept) < 2:
        raise ProblemError(
            f"only batches {kept} of {sweep} are within the memory limit max_batch {top}; "
            "a profile needs two or more"
        )
    return kept, top, source


def _layers(model: Any, ready: dict[str, float]) -> tuple[list[LayerGrad], list[str]]:
    """Gradients in the order they become ready; ties keep reverse forward order
    (later parameters first), as the backward pass visits them."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    reverse_rank = {name: -i for i, (name, _p) in enumerate(named)}
    layers = [
        LayerGrad(name=name, grad_bytes=p.numel() * p.element_size(), ready_frac=ready[name])
        for name, p in named
        if name in ready and p.numel() > 0
    ]
    layers.sort(key=lambda layer: (layer.ready_frac, reverse_rank[layer.name]))
    unused = [name for name, _p in named if name not in ready]
    return layers, unused


def _describe_optimizer(optimizer: Any) -> str:
    group = optimizer.param_groups[0]
    shown = {k: group[k] for k in ("lr", "momentum", "weight_decay") if k in group}
    return f"{type(optimizer).__name__}({', '.join(f'{k}={v}' for k, v in shown.items())})"
