"""Timing training iterations (Srifty 4.1): a copied model, loss and
optimizer on the profiling device (`make_trainer`), clocks (CUDA events on
GPUs), the latency repeats of a batch sweep, split over passes so that noise
from elsewhere on the machine spreads over every batch size, and the
gradient-readiness trace taken with a hook on every parameter."""

from __future__ import annotations

import copy
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from thrifty.core.errors import ProblemError
from thrifty.perfmodels.profile import ProfilePoint

if TYPE_CHECKING:  # pragma: no cover
    from thrifty.runtime.measure.zoo import Workload

__all__ = ["make_trainer", "timed_without_gc", "measure_sweep", "measure_readiness", "Samples", "point",
           "Marks", "DEFAULT_LR", "DEFAULT_MOMENTUM"]


DEFAULT_LR, DEFAULT_MOMENTUM = 1e-3, 0.9  # small: profiling must not make the weights blow up


class _CpuClock:
    def mark(self) -> float:
        return time.perf_counter()

    def sync(self) -> None:
        pass

    def seconds(self, start: Any, end: Any) -> float:
        return end - start


class _CudaClock:
    """CUDA events on the current stream: they time the GPU's timeline, and
    `sync` before reading them."""

    def __init__(self, torch: Any):
        self.torch = torch

    def mark(self) -> Any:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3


class Marks(NamedTuple):
    """Clock marks of one timed iteration: forward is ``start`` to
    ``forward_end``, backward to ``backward_end``, the step (with gradient
    zeroing) ``step_start`` to ``end``. Between ``backward_end`` and
    ``step_start`` the trainer's gradient exchange ran, if it has one
    (untimed)."""

    start: Any
    forward_end: Any
    backward_end: Any
    step_start: Any
    end: Any


@dataclass
class TimedTrainer:
    """The copied model, loss and optimizer on the profiling device.

    `exchange`, when given, runs between backward and the optimizer step of
    every iteration, untimed, where DDP exchanges gradients: the co-located
    sweep (`thrifty.runtime.measure.colocated`) exchanges them for real, so
    that its forward, backward and step are timed in the state a training
    iteration with communication leaves the host in (caches, a core that
    waited)."""

    torch: Any
    model: Any
    loss_fn: Any
    optimizer: Any
    make_batch: Callable[[int], Any]
    device: str
    clock: Any
    exchange: Callable[[], None] | None = None

    def batch(self, size: int) -> tuple[Any, Any]:
        try:
            inputs, targets = self.make_batch(size)
        except Exception as e:
            raise ProblemError(f"make_batch({size}) raised {type(e).__name__}: {e}") from e
        return _to_device(inputs, self.device), _to_device(targets, self.device)

    def iteration(self, inputs: Any, targets: Any) -> Marks:
        """One training iteration; returns its clock marks."""
        clock = self.clock
        clock.sync()
        t0 = clock.mark()
        loss = self.loss_fn(self.model(inputs), targets)
        t1 = clock.mark()
        loss.backward()
        t2 = t2_step = clock.mark()
        if self.exchange is not None:
            self.exchange()
            t2_step = clock.mark()
        self.optimizer.step()
        # As thrifty's worker loop (and PyTorch's default): the gradients are freed
        # and the next backward allocates them again. Under the allocator policy
        # every thrifty process runs with (thrifty.runtime.worlds.allocator)
        # that reuses heap memory, as a GPU's caching allocator does, instead of
        # paying page faults that depend on the process's malloc history.
        self.optimizer.zero_grad(set_to_none=True)
        t3 = clock.mark()
        clock.sync()
        return Marks(t0, t1, t2, t2_step, t3)


def _to_device(value: Any, device: str) -> Any:
    if hasattr(value, "to"):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Samples:
    forward_s: list[float]
    backward_s: list[float]
    step_s: list[float]

    def extend(self, more: "Samples") -> None:
        self.forward_s.extend(more.forward_s)
        self.backward_s.extend(more.backward_s)
        self.step_s.extend(more.step_s)


def _measure_latency(trainer: TimedTrainer, batch: int, warmup: int, repeats: int, tick: Callable[[], None]) -> Samples:
    inputs, targets = trainer.batch(batch)
    forward, backward, step = [], [], []
    for i in range(warmup + repeats):
        m = trainer.iteration(inputs, targets)
        if i >= warmup:
            forward.append(trainer.clock.seconds(m.start, m.forward_end))
            backward.append(trainer.clock.seconds(m.forward_end, m.backward_end))
            step.append(trainer.clock.seconds(m.step_start, m.end))
        tick()
    return Samples(forward, backward, step)


def measure_readiness(
    trainer: TimedTrainer, batch: int, repeats: int, tick: Callable[[], None]
) -> tuple[dict[str, float], list[float]]:
    """Mean ``ready_frac`` per parameter name (parameters whose gradient never
    became ready are left out) and the backward durations of the hooked runs."""
    clock = trainer.clock
    stamps: dict[str, Any] = {}

    def stamp_when_ready(name: str) -> Callable[[Any], None]:
        def hook(_parameter: Any) -> None:
            stamps[name] = clock.mark()

        return hook

    handles = [
        parameter.register_post_accumulate_grad_hook(stamp_when_ready(name))
        for name, parameter in trainer.model.named_parameters()
        if parameter.requires_grad
    ]
    inputs, targets = trainer.batch(batch)
    fractions: dict[str, list[float]] = {}
    backward: list[float] = []
    try:
        for i in range(1 + repeats):  # one warm-up run with the hooks in place
            stamps.clear()
            m = trainer.iteration(inputs, targets)
            t1, t2 = m.forward_end, m.backward_end
            if i == 0:
                tick()
                continue
            duration = clock.seconds(t1, t2)
            backward.append(duration)
            for name, stamp in stamps.items():
                frac = clock.seconds(t1, stamp) / duration if duration > 0 else 0.0
                fractions.setdefault(name, []).append(min(1.0, max(0.0, frac)))
            tick()
    finally:
        for handle in handles:
            handle.remove()
    return {name: statistics.fmean(values) for name, values in fractions.items()}, backward


def measure_sweep(
    trainer: TimedTrainer,
    sweep: list[int],
    warmup: int,
    repeats: int,
    rounds: int,
    report: Callable[[str], Callable[[], None]],
) -> dict[int, Samples]:
    """Latency samples per batch: `repeats` timed iterations per batch, split
    over `rounds` ascending passes over the sweep."""
    # The first iterations of a process pay one-time costs (lazy initialization,
    # allocator growth); paying them at the largest batch grows the allocator
    # once for every batch of the sweep.
    try:
        _first_iterations(trainer, sweep[-1])
    except trainer.torch.cuda.OutOfMemoryError as e:  # the device's memory changed since max_batch was found
        raise ProblemError(f"batch {sweep[-1]} ran out of GPU memory at the start of the sweep, after it fitted in "
                           f"the search for the largest batch; is another process using the GPU? (give --max-batch "
                           f"or --batches below it)") from e
    samples = {batch: Samples([], [], []) for batch in sweep}
    for round_index, round_repeats in enumerate(_split(repeats, rounds)):
        for batch in sweep:
            tick = report(f"batch {batch}, pass {round_index + 1} of {rounds}")
            measured = timed_without_gc(partial(_measure_latency, trainer, batch, warmup, round_repeats, tick))
            samples[batch].extend(measured)
    return samples


def _split(total: int, parts: int) -> list[int]:
    """`total` as `parts` near-equal positive counts, larger ones first."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _first_iterations(trainer: TimedTrainer, batch: int, count: int = 2) -> None:
    inputs, targets = trainer.batch(batch)
    for _ in range(count):
        trainer.iteration(inputs, targets)


def timed_without_gc(measure: Callable[[], Any]) -> Any:
    """Run `measure` with the garbage collector paused, so that a collection
    does not land inside a timed iteration."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return measure()
    finally:
        if was_enabled:
            gc.enable()


def make_trainer(torch: Any, workload: "Workload", device: str,
                 make_optimizer: Callable[[Any], Any] | None) -> TimedTrainer:
    """A timed training step for `workload` on `device` (a copy of its model; SGD unless
    `make_optimizer` is given), shared by `thrifty profile` and `thrifty profile-scaling`."""
    try:
        model = copy.deepcopy(workload.model)
        loss_fn = copy.deepcopy(workload.loss_fn) if isinstance(workload.loss_fn, torch.nn.Module) else workload.loss_fn
    except Exception as e:
        raise ProblemError(
            f"the model cannot be copied for profiling ({type(e).__name__}: {e}); "
            "the profiler trains a copy so that the caller's weights stay as they were"
        ) from e
    model = model.to(device).train()
    if isinstance(loss_fn, torch.nn.Module):
        loss_fn = loss_fn.to(device)
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        raise ProblemError("the model has no parameters that require gradients: there is nothing to train")
    if make_optimizer is None:
        optimizer = torch.optim.SGD(parameters, lr=DEFAULT_LR, momentum=DEFAULT_MOMENTUM)
    else:
        optimizer = make_optimizer(parameters)
    clock = _CudaClock(torch) if device == "cuda" else _CpuClock()
    return TimedTrainer(torch, model, loss_fn, optimizer, workload.make_batch, device, clock)


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def point(batch: int, samples: Samples) -> ProfilePoint:
    forward, forward_sd = _mean_sd(samples.forward_s)
    backward, backward_sd = _mean_sd(samples.backward_s)
    return ProfilePoint(
        batch=batch,
        forward_s=forward,
        backward_s=backward,
        forward_sd_s=forward_sd,
        backward_sd_s=backward_sd,
        repeats=len(samples.forward_s),
    )


