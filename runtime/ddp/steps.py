"""The pieces of one data-parallel training step (Srifty 4.5), shared by the
`Trainer` short form's loop (`thrifty.runtime.ddp.loop.trainer_loop`) and the
single-process reference: fetching a batch, an optimizer step, the per-rank
loss and metric report, and DDP's bucket priming.

This module imports torch at the top: only worker processes import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from thrifty.core.errors import ProblemError
from thrifty.runtime.ddp.checkpoint import capture_rng, rank_seed, restore_rng, seed_everything
from thrifty.runtime.ddp.sharding import ShardedStream
from thrifty.runtime.ddp.trainer import Trainer, load_trainer

__all__ = ["fetch_batch", "train_step", "step_with_outputs", "scaled_loss", "rank_report",
           "prime_buckets", "build_model", "call_factory", "single_process_reference"]


def fetch_batch(dataset: Any, indices: np.ndarray, device: Any) -> tuple[Any, Any]:
    """The samples at `indices` as one batch ``(inputs, targets)``; a
    ``TensorDataset`` is sliced, any other dataset is indexed and collated."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, (tuple, list)) and len(tensors) >= 2:
        index = torch.from_numpy(indices)
        inputs, targets = tensors[0][index], tensors[1][index]
    else:
        from torch.utils.data import default_collate

        inputs, targets = default_collate([dataset[int(i)] for i in indices])[:2]
    return inputs.to(device), targets.to(device)


def scaled_loss(loss_fn: Any, scale: float, outputs: Any, targets: Any) -> Any:
    """`loss_fn` times `scale` (the batch weighting's loss scale)."""
    return loss_fn(outputs, targets) * scale


def train_step(model: Any, optimizer: Any, loss_fn: Any, inputs: Any, targets: Any) -> Any:
    """One optimizer step; the loss."""
    return step_with_outputs(model, optimizer, loss_fn, inputs, targets)[0]


def step_with_outputs(model: Any, optimizer: Any, loss_fn: Any, inputs: Any, targets: Any) -> tuple[Any, Any]:
    """One optimizer step; (the loss, the detached outputs) for reports."""
    optimizer.zero_grad(set_to_none=True)
    outputs = model(inputs)
    loss = loss_fn(outputs, targets)
    loss.backward()
    optimizer.step()
    return loss, outputs.detach() if isinstance(outputs, torch.Tensor) else outputs


def rank_report(trainer: Trainer, spec: str, loss: Any, loss_unscale: float, outputs: Any,
                targets: Any) -> tuple[float, dict[str, float]]:
    """This rank's batch-mean loss (undoing the reweighting's loss scale) and
    the trainer's metrics on its batch."""
    values: dict[str, float] = {}
    if trainer.metrics is not None:
        with torch.no_grad():
            got = call_factory(spec, "metrics", trainer.metrics, outputs, targets)
        if not isinstance(got, Mapping):
            raise ProblemError(f"trainer '{spec}': metrics() returned a {type(got).__name__}, but must return a "
                               "mapping of names to numbers")
        for name, value in got.items():
            try:
                values[str(name)] = float(value)
            except (TypeError, ValueError, RuntimeError) as e:
                raise ProblemError(f"trainer '{spec}': metrics() gave {name!r} = {value!r}, which is not a "
                                   "number") from e
    return float(loss.detach().item()) * loss_unscale, values


def prime_buckets(ddp: Any, loss_fn: Any, inputs: Any, targets: Any, cuda_device: Any = None) -> None:
    """One forward and backward that changes nothing, so that every real
    iteration of every process runs on the same gradient buckets.

    DDP regroups its gradient buckets, in the order gradients became ready,
    after the first backward of each process; the order in which gloo's ring
    sums an element depends on where the element sits in its bucket. Without
    this, the first iteration after a resume would sum in another order than
    the uninterrupted run did, and the two would differ by rounding. The
    module's buffers (batch-norm statistics) and the random states are put
    back, and no optimizer step is taken."""
    buffers = [b.detach().clone() for b in ddp.module.buffers()]
    rng = capture_rng(cuda_device)
    loss_fn(ddp(inputs), targets).backward()
    ddp.zero_grad(set_to_none=True)
    with torch.no_grad():
        for saved, live in zip(buffers, ddp.module.buffers()):
            live.copy_(saved)
    restore_rng(rng, cuda_device)


def build_model(trainer: Trainer, spec: str, device: Any) -> Any:
    """The trainer's model on `device`; a clear error when it is not a module."""
    try:
        model = trainer.model()
    except Exception as e:
        raise ProblemError(f"trainer '{spec}': model() raised {type(e).__name__}: {e}") from e
    if not isinstance(model, torch.nn.Module):
        raise ProblemError(f"trainer '{spec}': model() returned a {type(model).__name__}, but must return a "
                           "torch.nn.Module")
    return model.to(device)


def call_factory(spec: str, name: str, factory: Any, *args: Any) -> Any:
    """``factory(*args)``; an exception becomes a `ProblemError` naming the trainer and the factory."""
    try:
        return factory(*args)
    except Exception as e:
        raise ProblemError(f"trainer '{spec}': {name}() raised {type(e).__name__}: {e}") from e


def single_process_reference(trainer: str, global_batch: int, iterations: int, seed: int = 0,
                             trainer_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Train on one process with the whole global batch, on the same data
    stream and from the same initial weights as a distributed run: the model's
    state dict after `iterations` steps. Gradient reweighting makes any
    distributed run of the same job equal to this (up to rounding)."""
    made = load_trainer(trainer, trainer_args)
    seed_everything(seed)
    model = build_model(made, trainer, torch.device("cpu"))
    optimizer = call_factory(trainer, "optimizer", made.optimizer, model.parameters())
    dataset = call_factory(trainer, "dataset", made.dataset)
    stream = ShardedStream(len(dataset), global_batch, 0, global_batch, seed)
    seed_everything(rank_seed(seed, 0, 0))
    for it in range(iterations):
        inputs, targets = fetch_batch(dataset, stream.indices(it), torch.device("cpu"))
        train_step(model, optimizer, made.loss, inputs, targets)
    return model.state_dict()
