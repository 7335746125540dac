"""Measure a compute profile from the job itself: the user's own loop, timed
at each batch size (``thrifty profile mypkg.jobs:train``).

`resolve_target` is the one resolution of what ``thrifty profile`` names: a
`Workload` factory (``(model, make_batch, loss_fn)``, profiled by
`profile_workload` as before), a loop function ``train(ctx, **args)``, or a
factory of the four-factory `Trainer` (the short form, run as its loop
function `trainer_loop`).

A job is profiled by calling its loop with a `ProfilingContext`, the
`JobContext` contract on one process: ``local_batch`` is the batch being
timed, ``prepare_loader`` is the run's own loader at that batch (the job's
data in the plan's order, its collate function, workers and options kept),
``restore`` is None, and ``report`` ends the loop
(`StopJob`) once enough iterations are timed. ``prepare_model`` installs the
timing hooks on the model the loop trains:

- a forward pre-hook and a forward hook: the forward pass (the model's
  calls in training mode, summed over an iteration's micro-batches);
- ``register_post_accumulate_grad_hook`` on every parameter: when each
  gradient is ready; the backward pass is from the end of the iteration's last
  forward to the last gradient ready (the loss is in it), plus, with
  micro-batches (gradient accumulation), the time between one micro-batch's
  forward and the next one's (their backward passes); each gradient's
  ``ready_frac`` is its time in the last span over that span (the last
  micro-batch's backward is the one whose gradients DDP exchanges);
- the step: the rest of the iteration, from the last gradient to the report,
  plus the time before the first forward (the optimizer step, zeroing, the
  schedule, clipping, drawing the next batch): every part of the loop's
  iteration is in one of the three.

On CUDA every timestamp follows ``torch.cuda.synchronize()``. Each batch is
timed in `rounds` passes over the sweep (a fresh call of the loop each, after
`warmup` untimed iterations), as `profile_workload` spreads noise. DDP's
overhead: the loop at the readiness batch, with ``prepare_model`` wrapping the
model in DDP on a world of one in this process, against the plain model, the
passes interleaved; the difference of their mean iterations.

``max_batch`` is the largest batch swept (the job's memory is not searched).
The profile's ``extra.job`` names the job, its arguments and its cache key
(`thrifty.perfmodels.job_profiles.job_key`); its provenance is ``measured``
with the command and ``notes`` saying it was measured from the job.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from thrifty.core.errors import ProblemError, ThriftyError
from thrifty.perfmodels.job_profiles import job_key
from thrifty.perfmodels.profile import ComputeProfile, LayerGrad, ProfilePoint, Provenance
from thrifty.runtime.measure.workloads import as_workload, device_label, import_torch, machine_description, \
    resolve_device

__all__ = ["ProfileTarget", "resolve_target", "ProfilingContext", "profile_job"]


@dataclass(frozen=True)
class ProfileTarget:
    """What ``thrifty profile SPEC`` measures: a `Workload` (`workload`), or a
    job (`loop`, called with the context: the loop function with the job's
    arguments, or `trainer_loop` with the `Trainer` a factory returned)."""

    spec: str
    args: Mapping[str, Any]
    workload: Any = None
    loop: Callable[..., Any] | None = None

    @property
    def is_job(self) -> bool:
        return self.loop is not None


def resolve_target(spec: str, args: Mapping[str, Any] | None = None) -> ProfileTarget:
    """Resolve `spec` once: a loop function (its first parameter the job's
    context), else a factory called with `args` whose value is a `Trainer`
    (a job in its short form) or a workload."""
    from thrifty.runtime.ddp.trainer import Trainer, is_loop_function
    from thrifty.runtime.worlds import resolve_factory

    args = dict(args or {})
    function = resolve_factory(spec, returns="a Workload, a Trainer, or a loop function taking the job's context")
    if is_loop_function(function, args):
        from thrifty.runtime.ddp.trainer import check_loop_arguments

        check_loop_arguments(spec, function, args)
        return ProfileTarget(spec, args, loop=lambda ctx: function(ctx, **args))
    try:
        made = function(**args)
    except ThriftyError:
        raise
    except Exception as e:
        raise ProblemError(f"factory '{spec}' raised {type(e).__name__}: {e}") from e
    if isinstance(made, Trainer):
        from thrifty.runtime.ddp.loop import trainer_loop

        return ProfileTarget(spec, args, loop=lambda ctx: trainer_loop(ctx, made))
    return ProfileTarget(spec, args, workload=as_workload(made, source=f"factory '{spec}'"))


@dataclass
class _Iteration:
    """One iteration's timestamps (perf_counter seconds)."""

    start: float
    forwards: list[tuple[float, float]] = field(default_factory=list)
    ready: dict[str, float] = field(default_factory=dict)
    end: float = 0.0


class ProfilingContext:
    """The job contract on one process, for timing (module docstring)."""

    def __init__(self, spec: str, local_batch: int, device: Any, iterations: int, ddp: bool = False):
        import torch

        from thrifty.runtime.ddp.job import JobSpec

        self.job = JobSpec(trainer=spec, checkpoint_path="profile-unused", global_batch=local_batch,
                           iterations=iterations, weighting="mean", metrics_every_s=None, checkpoint_every=None)
        self.local_batch = self.global_batch = local_batch
        self.batches = [local_batch]
        self.rank, self.world_size, self.device = 0, 1, device
        self.iterations = iterations
        self.steps_per_iteration = 1
        self.step = 0
        self.loss_scale = 1.0
        self.model: Any = None
        self.timed: list[_Iteration] = []
        self._ddp = ddp
        self._cuda = device.type == "cuda"
        self._torch = torch
        self._current: _Iteration | None = None
        self._names: dict[int, str] = {}
        self.grad_bytes: dict[str, int] = {}
        self._draw_until = -1  # the loader's draws all take the long path here (`JobContext._settle`)

    @property
    def iteration(self) -> int:
        return self.step // self.steps_per_iteration

    def _now(self) -> float:
        if self._cuda:
            self._torch.cuda.synchronize()
        return time.perf_counter()

    def prepare_model(self, model: Any, *, scale_loss: bool = False) -> Any:
        """The model with the timing hooks (module docstring), wrapped as DDP
        wraps it (in DDP itself when timing DDP's overhead)."""
        wrong = "called prepare_model twice; a job trains one model" if self.model is not None else \
            None if isinstance(model, self._torch.nn.Module) else \
            f"gave prepare_model a {type(model).__name__}, but it takes a torch.nn.Module"
        if wrong is not None:
            raise ProblemError(f"job '{self.job.trainer}' {wrong}")
        model = model.to(self.device)
        self._names = {id(p): name for name, p in model.named_parameters()}
        self.grad_bytes = {name: p.numel() * p.element_size() for name, p in model.named_parameters()}
        if self._ddp:
            from thrifty.runtime.ddp.reweight import data_parallel

            model = data_parallel(model, [self.device.index] if self._cuda else None)
        else:
            model = _plain_wrapper()(model)
            model.register_forward_pre_hook(self._forward_began)
            model.register_forward_hook(self._forward_ended)
            for p in model.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._grad_ready)
        self.model = model
        self._current = _Iteration(self._now())
        return model

    def _forward_began(self, module: Any, args: Any) -> None:
        if module.training and self._torch.is_grad_enabled() and self._current is not None:
            self._current.forwards.append((self._now(), 0.0))

    def _forward_ended(self, module: Any, args: Any, output: Any) -> None:
        if module.training and self._torch.is_grad_enabled() and self._current is not None \
                and self._current.forwards:
            began = self._current.forwards[-1][0]
            self._current.forwards[-1] = (began, self._now())

    def _grad_ready(self, param: Any) -> None:
        if self._current is not None:
            self._current.ready[self._names.get(id(param), "?")] = self._now()

    def prepare_loader(self, data: Any, *, to_device: bool = True) -> Any:
        """The run's own loader (`thrifty.runtime.ddp.context.RankLoader`: the
        job's data in the plan's order, its collate function, workers and
        options kept), at the batch being timed, to the profiling pass's end."""
        from thrifty.runtime.ddp.context import RankLoader

        return RankLoader(self, data, to_device)  # type: ignore[arg-type]  # the context's surface it reads

    def _who(self) -> str:
        return f"job '{self.job.trainer}' (profiled at batch {self.local_batch})"

    def _before_batch(self) -> None:
        """What the run's context does before each batch; nothing to do here."""

    def restore(self) -> None:
        return None

    def report(self, metrics: Any = None, checkpoint: Any = None) -> None:
        from thrifty.runtime.ddp.context import StopJob

        if self.model is None:
            raise ProblemError(f"job '{self.job.trainer}' reported without calling ctx.prepare_model(model)")
        now = self._now()
        if self._current is not None:
            self._current.end = now
            self.timed.append(self._current)
        self._current = _Iteration(now)
        if self.iteration >= self.iterations:
            raise StopJob()


@functools.cache
def _plain_wrapper() -> Any:
    """A module that wraps a model as DDP does (``.module``, the same
    state-dict keys, ``no_sync()``) without DDP: a loop written for the prepared model runs
    unchanged, timed without DDP's work."""
    import torch

    class Prepared(torch.nn.Module):
        def __init__(self, module: Any):
            super().__init__()
            self.module = module

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return self.module(*args, **kwargs)

        def no_sync(self) -> Any:
            """DDP's context of gradient accumulation; nothing to skip here."""
            import contextlib

            return contextlib.nullcontext()

    return Prepared


def _run_loop(target: ProfileTarget, batch: int, device: Any, iterations: int, ddp: bool = False) \
        -> ProfilingContext:
    from thrifty.runtime.ddp.context import StopJob

    assert target.loop is not None
    ctx = ProfilingContext(target.spec, batch, device, iterations, ddp)
    try:
        target.loop(ctx)
    except StopJob:
        pass
    except ThriftyError:
        raise
    except Exception as e:
        raise ProblemError(f"job '{target.spec}' raised {type(e).__name__} while profiled at batch {batch}: "
                           f"{e}") from e
    if len(ctx.timed) < iterations:
        raise ProblemError(f"job '{target.spec}' reported {len(ctx.timed)} iterations at batch {batch}, but "
                           f"{iterations} were asked: iterate ctx.prepare_loader(...) and ctx.report() each iteration")
    return ctx


def _split(it: _Iteration) -> tuple[float, float, float]:
    """(forward, backward, step) seconds of one timed iteration."""
    if not it.forwards or not it.ready:
        raise ProblemError("the job's iteration ran no forward and backward pass through the prepared model")
    forward = sum(end - began for began, end in it.forwards)
    # from the first forward to the last gradient, what is not forward: every micro-batch's backward (and loss)
    backward = max(it.ready.values()) - it.forwards[0][0] - forward
    step = (it.end - it.start) - forward - backward
    return forward, max(backward, 1e-9), max(step, 0.0)


def profile_job(target: ProfileTarget, *, model_name: str, batches: Sequence[int], repeats: int = 10,
                warmup: int = 3, rounds: int = 3, threads: int = 1, device: str = "auto",
                device_name: str | None = None, command: str | None = None,
                ready_batch: int | None = None) -> ComputeProfile:
    """Time the job's own loop at each of `batches` (module docstring) and
    return its compute profile, whose ``extra.job`` keys it to the job."""
    from thrifty.runtime.measure.profiler import READY_BATCH_TARGET, _checked_batches, _nearest_batch

    torch = import_torch()
    sweep = _checked_batches(batches)
    resolved = resolve_device(device)
    where = torch.device(resolved)
    rounds = min(rounds, repeats)
    ready_at = ready_batch if ready_batch is not None else _nearest_batch(sweep, READY_BATCH_TARGET)
    per_round = [repeats // rounds + (1 if r < repeats % rounds else 0) for r in range(rounds)]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    samples: dict[int, list[tuple[float, float, float]]] = {b: [] for b in sweep}
    ready: dict[str, list[float]] = {}
    grad_bytes: dict[str, int] = {}
    try:
        for count in per_round:
            for batch in sweep:
                ctx = _run_loop(target, batch, where, warmup + count)
                timed = ctx.timed[warmup:]
                samples[batch] += [_split(it) for it in timed]
                if batch == ready_at:
                    for it in timed:
                        began = it.forwards[-1][1]
                        span = max(it.ready.values()) - began
                        for name, at in it.ready.items():
                            ready.setdefault(name, []).append(min(1.0, max(0.0, (at - began) / span)))
                    grad_bytes = ctx.grad_bytes
        ddp_s = _ddp_overhead(target, ready_at, where, warmup, repeats, rounds)
    finally:
        torch.set_num_threads(previous)
    layers = sorted((LayerGrad(name=name, grad_bytes=grad_bytes[name], ready_frac=statistics.fmean(fracs))
                     for name, fracs in ready.items() if grad_bytes.get(name)), key=lambda layer: layer.ready_frac)
    if not layers:
        raise ProblemError(f"job '{target.spec}': no parameter of the prepared model got a gradient")
    points = []
    for batch, values in samples.items():
        fwd, bwd = [v[0] for v in values], [v[1] for v in values]
        points.append(ProfilePoint(batch=batch, forward_s=statistics.fmean(fwd), backward_s=statistics.fmean(bwd),
                                   forward_sd_s=statistics.pstdev(fwd), backward_sd_s=statistics.pstdev(bwd),
                                   repeats=len(values)))
    key = job_key(target.spec, target.args)
    return ComputeProfile(
        model=model_name,
        device=device_name or device_label(resolved),
        provenance=Provenance(kind="measured", command=command or f"thrifty profile {target.spec}",
                              machine=machine_description(resolved, threads),
                              date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
                              notes=f"measured from the job '{target.spec}' itself (its own loop), "
                                    f"arguments {json.dumps(dict(target.args), sort_keys=True)}, key {key}"),
        max_batch=sweep[-1],
        step_s=statistics.fmean(v[2] for values in samples.values() for v in values),
        points=points,
        layers=layers,
        ddp_overhead_s=ddp_s,
        extra={"job": {"spec": target.spec, "args": dict(target.args), "key": key}, "threads": threads,
               "warmup": warmup, "rounds": rounds, "ready_batch": ready_at, "max_batch_source": "swept"},
    )


def _ddp_overhead(target: ProfileTarget, batch: int, device: Any, warmup: int, repeats: int, rounds: int) -> float:
    """The loop at `batch` with DDP (a world of one, in this process) against
    the plain model, passes interleaved: the difference of their mean
    iterations (0 when DDP is not slower)."""
    import torch.distributed as dist

    from thrifty.runtime.worlds import leave_group

    created = not dist.is_initialized()
    if created:
        store = dist.HashStore()
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=0, world_size=1)
    try:
        plain: list[float] = []
        wrapped: list[float] = []
        count = max(1, repeats // rounds)
        for _ in range(rounds):
            for ddp, out in ((False, plain), (True, wrapped)):
                out += _loop_times(target, batch, device, warmup, count, ddp)
    finally:
        if created:  # the DDP models are gone with their contexts: `leave_group` says why that matters
            leave_group()
    return max(0.0, statistics.fmean(wrapped) - statistics.fmean(plain))


def _loop_times(target: ProfileTarget, batch: int, device: Any, warmup: int, count: int, ddp: bool) -> list[float]:
    """The iteration times of one pass of the loop (`warmup` + `count`
    iterations, the first `warmup` left out). The pass's context, and with it
    its model, is gone when this returns."""
    ctx = _run_loop(target, batch, device, warmup + count, ddp)
    return [it.end - it.start for it in ctx.timed[warmup:]]
