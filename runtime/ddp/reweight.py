"""Gradient reweighting for heterogeneous local batches (Srifty 4.5).

PyTorch DDP averages gradients over ranks as if every rank had the same batch:
``g = (1/W) sum_r mean_r``. With local batches ``b_r`` summing to ``B`` that
gives the samples of small ranks too much weight. Srifty weights rank r's
gradient by ``b_r * W / B`` before the average, so that

    (1/W) sum_r (b_r W / B) * (1/b_r) sum_{j in r} g_j  =  (1/B) sum_j g_j,

the gradient of single-device training on the global batch: every sample
counts equally whatever its machine. Three equivalent implementations:

- `loss_scale` (the runtime's default, ``weighting="batch"``): multiply the
  rank's batch-mean loss by ``b_r * W / B`` before backward, so its gradient
  is weighted before DDP's own (C++) averaging. It costs one scalar multiply.
- `OutputWeighting` (a loop function's, whose loss the runtime does not
  see): the gradient reaching each output of the model's training forwards
  is multiplied by ``b_r * W / B``, so every gradient through the outputs is
  weighted before DDP's own average, as by loss scaling, whatever the loss.
  One small multiply per output.
- `batch_weighted_allreduce`, a DDP communication hook (``weighting="hook"``,
  and a loop's fallback for outputs `OutputWeighting` cannot look into):
  each rank multiplies its gradient bucket by ``b_r / B`` and the buckets are
  summed. Same result; a Python hook (a call and a thread hand-off per
  bucket) costs some percent of throughput on models with large gradients
  or short iterations (``benchmarks/runtime_overheads.py`` measures it;
  PyTorch's own Python ``allreduce_hook`` costs the same), and it is the
  form to compose with other communication hooks.

Both need the loss to be a batch mean (PyTorch's default), and layers whose
output depends on the batch (batch norm) still see only their local batch, as
in any data-parallel run.

This module imports torch: only worker processes import it. (No postponed
annotations here: DDP checks the hook's ``bucket`` annotation at run time.)
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["batch_weight", "loss_scale", "ReweightState", "batch_weighted_allreduce", "register_reweighting",
           "OutputWeighting"]


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


_SUM = dist.AllreduceOptions()
_SUM.reduceOp = dist.ReduceOp(dist.ReduceOp.SUM)


def batch_weighted_allreduce(state: ReweightState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: scale the bucket by this rank's weight, then sum
    it over ranks (no division by the world size). It calls the process
    group's all-reduce directly, as DDP's own C++ averaging does, rather than
    through ``dist.all_reduce``'s Python checks, which cost about as much
    again as the rest of the hook on a model with small buckets."""
    tensor = bucket.buffer()
    tensor.mul_(state.weight)
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    assert group is not None, "DDP runs in a process group"
    return group.allreduce([tensor], _SUM).get_future().then(_summed)


def _summed(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
    return fut.value()[0]


def register_reweighting(ddp_model: Any, local_batch: int, global_batch: int,
                         process_group: Any = None) -> ReweightState:
    """Install the hook on a `DistributedDataParallel` model; returns its state."""
    state = ReweightState(batch_weight(local_batch, global_batch), process_group)
    ddp_model.register_comm_hook(state, batch_weighted_allreduce)
    return state


class OutputWeighting:
    """Reweighting on the model's outputs, for a loop whose loss the runtime
    does not see (`thrifty.runtime.ddp.context`'s `prepare_model`): a forward
    hook of the DDP model puts, on each output tensor of a forward with
    gradients on, a tensor hook that multiplies the gradient reaching it by
    ``b_r * W / B`` (`loss_scale`). Every parameter gradient that flows
    through the outputs is so weighted before DDP's own (C++) averaging,
    exactly as if the loss were scaled, whatever the loss; a term of the
    loss on the parameters alone (weight decay), the same on every rank, is
    averaged unchanged, as the communication hook leaves it. It costs one
    small multiply per output in backward, where the communication hook costs
    a Python call and a thread hand-off per bucket.

    An output in which no tensor can be found (a custom object) is out of its
    reach: the first such forward installs the communication hook instead
    (`register_reweighting`), for good."""

    def __init__(self, ddp_model: Any, local_batch: int, global_batch: int, world_size: int):
        self.ddp_model, self.local_batch, self.global_batch = ddp_model, local_batch, global_batch
        self.scale = loss_scale(local_batch, global_batch, world_size)
        self.handle = ddp_model.register_forward_hook(self._forward)

    def _forward(self, module: Any, args: Any, output: Any) -> None:
        if not torch.is_grad_enabled():
            return
        tensors: list[torch.Tensor] = []
        if _tensors_of(output, tensors):
            for tensor in tensors:
                tensor.register_hook(self._grad)
        else:  # nothing this can look into: weigh the buckets instead
            self.handle.remove()
            register_reweighting(self.ddp_model, self.local_batch, self.global_batch)

    def _grad(self, grad: torch.Tensor) -> torch.Tensor:
        return grad * self.scale


def _tensors_of(output: Any, into: list[torch.Tensor]) -> bool:
    """Collect the tensors of `output` that need a gradient into `into`; False
    when `output` holds something this cannot look into."""
    if isinstance(output, torch.Tensor):
        if output.requires_grad:
            into.append(output)
        return True
    if isinstance(output, (tuple, list)):
        return all([_tensors_of(v, into) for v in output])
    if isinstance(output, Mapping):
        return all([_tensors_of(v, into) for v in output.values()])
    if is_dataclass(output) and not isinstance(output, type):
        return all([_tensors_of(getattr(output, f.name), into) for f in fields(output)])
    return output is None or isinstance(output, (int, float, bool, str, bytes))
