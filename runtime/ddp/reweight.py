"""Gradient reweighting for heterogeneous local batches (Srifty 4.5).

PyTorch DDP averages gradients over ranks as if every rank had the same batch:
``g = (1/W) sum_r mean_r``. With local batches ``b_r`` summing to ``B`` that
gives the samples of small ranks too much weight. Srifty weights rank r's
gradient by ``b_r * W / B`` before the average, so that

    (1/W) sum_r (b_r W / B) * (1/b_r) sum_{j in r} g_j  =  (1/B) sum_j g_j,

the gradient of single-device training on the global batch: every sample
counts equally whatever its machine. Two equivalent implementations:

- `loss_scale` (the runtime's default, ``weighting="batch"``): multiply the
  rank's batch-mean loss by ``b_r * W / B`` before backward, so its gradient
  is weighted before DDP's own (C++) averaging. It costs one scalar multiply.
- `batch_weighted_allreduce`, a DDP communication hook (``weighting="hook"``):
  each rank multiplies its gradient bucket by ``b_r / B`` and the buckets are
  summed. Same result; a Python hook costs some percent of throughput on
  models with large gradients (``benchmarks/runtime_overheads.py`` measures
  both; PyTorch's own Python ``allreduce_hook`` costs the same), and it is the
  form to compose with other communication hooks.

Both need the loss to be a batch mean (PyTorch's default), and layers whose
output depends on the batch (batch norm) still see only their local batch, as
in any data-parallel run.

This module imports torch: only worker processes import it. (No postponed
annotations here: DDP checks the hook's ``bucket`` annotation at run time.)
"""

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["batch_weight", "loss_scale", "ReweightState", "batch_weighted_allreduce", "register_reweighting"]


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


def batch_weighted_allreduce(state: ReweightState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: scale the bucket by this rank's weight, then sum
    it over ranks (no division by the world size)."""
    tensor = bucket.buffer()
    tensor.mul_(state.weight)
    work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=state.process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def register_reweighting(ddp_model: Any, local_batch: int, global_batch: int,
                         process_group: Any = None) -> ReweightState:
    """Install the hook on a `DistributedDataParallel` model; returns its state."""
    state = ReweightState(batch_weight(local_batch, global_batch), process_group)
    ddp_model.register_comm_hook(state, batch_weighted_allreduce)
    return state
