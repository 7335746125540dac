"""Gradient reweighting for heterogeneous local batches (Srifty 4.5).

PyTorch DDP averages gradients over ranks as if every rank had the same batch:
``g = (1/W) sum_r mean_r``. With local batches ``b_r`` summing to ``B`` that
gives the samples of small ranks too much weight. Srifty weights rank r's
gradient by ``b_r * W / B`` before the average, so that

    (1/W) sum_r (b_r W / B) * (1/b_r) sum_{j in r} g_j  =  (1/B) sum_j g_j,

the gradient of single-device training on the global batch: every sample
counts equally whatever its machine. Two equivalent implementations:

- `loss_scale` (the `Trainer` short form's, whose loss the runtime computes,
  and a loop's with ``prepare_model(model, scale_loss=True)``): multiply the
  rank's batch-mean loss by ``b_r * W / B`` before backward, so its gradient
  is weighted before DDP's own (C++) averaging. It costs one scalar multiply.
- `batch_weighted_allreduce`, a DDP communication hook (a loop function's
  default, whose loss the runtime does not see, and ``weighting="hook"``):
  each rank multiplies its gradient bucket by ``b_r / B`` and the buckets are
  summed. Same result whatever the loss is made of: terms that reach the
  parameters through the model's outputs or around them (an auxiliary loss
  a module keeps, as mixture-of-experts layers do). On host tensors (gloo)
  the hook is C++ (`thrifty.runtime.ddp.native`: built on first use, this
  function's weighting in PyTorch's own built-in hook), which costs what
  DDP's own averaging costs: in `benchmarks/runtime_overheads.py`'s paths
  section (2 ranks, tiny-mlp at 24 + 40 samples, 24 runs) the loop path
  with it ran 4.4% and 0.9% faster than plain DDP with its loss scaled in
  two runs, where with the Python hook it ran 3.0 to 6.7% slower. Where the C++ hook cannot be
  built, and on GPUs, `batch_weighted_allreduce` is the hook. It costs a
  Python call per bucket: it calls the process group's all-reduce directly,
  without ``dist.all_reduce``'s Python checks, and chains the bucket out of
  the work's future, as PyTorch's own ``allreduce_hook`` does, except for
  the iteration's last bucket on host tensors, whose sum it waits for
  itself (the backward pass ends waiting for it anyway), handing DDP a
  completed future: that spares the chained callback, a second Python call
  on gloo's thread. Measured on a gloo world of one (tiny-mlp at batch 32,
  3 instances of each, 60 interleaved rounds of 50 iterations): the chained
  hook cost +50 us an iteration over DDP without a hook, this one +24 us;
  the float32 factor below then took the multiply from 7.3 to 3.6 us
  (timed inside the hook). On 2 ranks (tiny-mlp, 24 + 40 samples,
  `benchmarks/runtime_overheads.py`'s paths section) what is left shows:
  the loop path with the hook measured +3.0 to +6.7% against plain DDP in
  five runs of the section, the one that scales its own loss +0.3
  to +4.2%, about 2 points less, in the same runs; on the zoo's models,
  whose iterations take 17 ms and more, the two are level.
  (An earlier version that waited for every bucket's sum in the last
  bucket's hook measured slower than chaining, but with one pair of model
  instances a run, whose difference is itself a few percent.)
  Weighting at the outputs instead (a tensor hook multiplying the gradient
  reaching each output) would cost less, but misses every term that
  reaches the parameters around the outputs, so it is not used.

Both need the loss to be a batch mean (PyTorch's default), and layers whose
output depends on the batch (batch norm) still see only their local batch, as
in any data-parallel run.

This module imports torch: only worker processes import it. (No postponed
annotations here: DDP checks the hook's ``bucket`` annotation at run time.)
"""

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from thrifty.runtime.ddp.native import weighted_hook as native_hook

__all__ = ["batch_weight", "loss_scale", "ReweightState", "batch_weighted_allreduce", "register_reweighting",
           "data_parallel"]


def data_parallel(model: Any, device_ids: list[int] | None = None) -> Any:
    """`model` wrapped in `DistributedDataParallel` as every training rank,
    profiler and measurement of thrifty wraps it: with its gradients as
    views of DDP's communication buckets (``gradient_as_bucket_view``).

    By default DDP keeps the gradients apart from its buckets: it copies each
    one into its bucket as it is ready (one tensor operation per parameter)
    and the bucket back into the gradients once summed. As views, the summed
    bucket is the gradients: no copy back, and no second copy of the
    gradients in memory (and a loop that keeps its gradients between
    iterations, ``zero_grad(set_to_none=False)``, accumulates them in the
    buckets in place, without the first copy either).
    Measured here: what DDP adds to an mlp iteration (2.5M parameters, batch
    32, a gloo world of one, `measure_ddp_overhead`) went from 2.06 and 2.01
    ms to 1.47 and 1.66 ms; in `benchmarks/runtime_overheads.py`'s paths
    section (2 ranks) the mlp's loop and Trainer paths ran 1.4 to 4.3%
    faster than a hand-written loop with DDP's defaults (equal batches, two
    runs of the section); on tiny-mlp (4 small gradients) the gain is within
    the noise. The same training: a view is the gradient DDP would have
    copied back. What a loop cannot do with them is ``grad.detach_()``
    (PyTorch's ``zero_grad`` does not; it sets gradients to None, and DDP
    makes them views again in the next backward pass)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)


def batch_weight(local_batch: int, global_batch: int) -> float:
    """The factor of one rank's mean gradient in the summed gradient: ``b_r / B``."""
    if not 0 < local_batch <= global_batch:
        raise ValueError(f"local batch {local_batch} must be in 1..{global_batch} (the global batch)")
    return local_batch / global_batch


def loss_scale(local_batch: int, global_batch: int, world_size: int) -> float:
    """The factor of one rank's mean loss before DDP's average: ``b_r * W / B``."""
    return batch_weight(local_batch, global_batch) * world_size


@dataclass(frozen=True)
class ReweightState:
    weight: float
    process_group: Any = None
    wait_last: bool = False  # wait for the last bucket in the hook (host tensors: `batch_weighted_allreduce`)
    native: bool = False  # the C++ hook does the weighting (`register_reweighting`)
    # the weight as a 0-dim host float32 tensor, for float32 buckets: a bucket's ``mul_`` by it took 3 us in the
    # hook where the Python float took 7 us (tiny-mlp, a world of one), and it is the same factor (PyTorch casts
    # a Python float to float32 for a float32 tensor); other dtypes take the Python float
    factor: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", torch.tensor(self.weight, dtype=torch.float32))


_SUM = dist.AllreduceOptions()
_SUM.reduceOp = dist.ReduceOp(dist.ReduceOp.SUM)


def batch_weighted_allreduce(state: ReweightState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: scale the bucket by this rank's weight, then sum
    it over ranks (no division by the world size). It calls the process
    group's all-reduce directly, as DDP's own C++ averaging does, rather than
    through ``dist.all_reduce``'s Python checks, which cost about as much
    again as the rest of the hook on a model with small buckets."""
    tensor = bucket.buffer()
    tensor.mul_(state.factor if tensor.dtype == torch.float32 else state.weight)
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    assert group is not None, "DDP runs in a process group"
    work = group.allreduce([tensor], _SUM)
    if state.wait_last and bucket.is_last():
        # the backward pass ends waiting for the last bucket anyway: waiting here, with the GIL released, spares
        # the callback chained on the work's future (a Python call on gloo's thread once the sum is in, and DDP
        # reading its result back), about 30 us of a tiny-mlp iteration on a world of one
        work.wait()
        summed: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        summed.set_result(tensor)
        return summed
    return work.get_future().then(_summed)


def _summed(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
    return done.value()[0]


def register_reweighting(ddp_model: Any, local_batch: int, global_batch: int,
                         process_group: Any = None, native: bool = True) -> ReweightState:
    """Install the hook on a `DistributedDataParallel` model; returns its
    state. On host tensors (gloo) the hook is the C++ one
    (`thrifty.runtime.ddp.native`) where it builds and `native` is true; else
    the Python one, which on host tensors waits for the last bucket's sum
    itself and on a GPU chains, as the stream semantics of CUDA futures want."""
    on_host = all(p.device.type == "cpu" for p in ddp_model.parameters())
    weight = batch_weight(local_batch, global_batch)
    group = process_group if process_group is not None else ddp_model.process_group
    module = native_hook() if native and on_host else None
    state = ReweightState(weight, group, wait_last=on_host, native=module is not None)
    if module is not None:
        module.register_weighted_allreduce(ddp_model.reducer, group, weight)
        ddp_model.logger._set_comm_hook_name("thrifty.runtime.ddp.native:weighted_hook")  # as DDP names a hook
    else:
        ddp_model.register_comm_hook(state, batch_weighted_allreduce)
    return state
