"""The largest batch that fits (Srifty 4.1): on CUDA a doubling-then-bisection
search for the largest batch whose iteration does not run out of memory; on
CPU, given a memory limit, an estimate from the activations autograd saves."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from thrifty.core.errors import ProblemError
from thrifty.runtime.measure.timing import TimedTrainer

__all__ = ["iteration_fits", "search_max_batch", "estimate_max_batch"]


STEADY_ITERATIONS = 3  # iterations in a row that must fit: the first differs from the ones after it


def iteration_fits(trainer: TimedTrainer, batch: int, iterations: int = STEADY_ITERATIONS) -> bool:
    """Whether training at `batch` runs without a CUDA OOM: `iterations`
    iterations in a row on one batch, as the profiler's sweep and a training
    loop run them. One iteration is not enough: at the edge of memory the
    first iteration can fit while the next does not (the first step creates
    the optimizer's state, and the caching allocator's blocks and the
    convolution algorithms' workspaces chosen after it differ), and a batch
    found by a one-iteration test ran out of memory in the sweep on an H100."""
    torch = trainer.torch
    try:
        inputs, targets = trainer.batch(batch)
        for _ in range(iterations):
            trainer.iteration(inputs, targets)
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        trainer.optimizer.zero_grad(set_to_none=True)
        inputs = targets = None  # drop the batch before the cache is emptied
        gc.collect()
        torch.cuda.empty_cache()


def search_max_batch(fits: Callable[[int], bool], cap: int) -> int | None:
    """The largest batch in ``[1, cap]`` for which `fits` holds, assuming it is
    monotone: double until it fails (or reaches `cap`), then bisect (Srifty 4.1).
    ``None`` when not even batch 1 fits."""
    if not fits(1):
        return None
    good, bad = 1, None
    while bad is None:
        trial = min(good * 2, cap)
        if trial == good:
            return good
        if fits(trial):
            good = trial
        else:
            bad = trial
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good


def estimate_max_batch(trainer: TimedTrainer, memory_limit_bytes: int, probe_batches: tuple[int, int] = (2, 8)) -> int:
    """The largest batch whose estimated training memory is within the limit.

    memory(B) = 3 * parameter bytes (weights, gradients, momentum)
                + saved activations(B) + inputs(B),
    with the activations that autograd saves for backward measured at two small
    batches and extrapolated linearly. It leaves out temporaries, so it is an
    optimistic estimate: give the limit with some headroom.
    """
    torch = trainer.torch
    parameter_storages = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    state_bytes = 3 * sum(p.numel() * p.element_size() for p in trainer.model.parameters())

    def batch_bytes(batch: int) -> int:
        inputs, targets = trainer.batch(batch)
        seen: dict[int, int] = {}
        for tensor in (inputs, targets):
            if hasattr(tensor, "untyped_storage"):
                seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()

        def pack(tensor: Any) -> Any:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in parameter_storages:
                seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            trainer.loss_fn(trainer.model(inputs), targets)
        return sum(seen.values())

    small, large = probe_batches
    bytes_small, bytes_large = batch_bytes(small), batch_bytes(large)
    per_sample = max(1.0, (bytes_large - bytes_small) / (large - small))
    fixed = state_bytes + max(0.0, bytes_small - per_sample * small)
    if fixed + per_sample > memory_limit_bytes:
        raise ProblemError(
            f"the memory limit is {memory_limit_bytes / 2**30:.3g} GiB, but the model needs an "
            f"estimated {(fixed + per_sample) / 2**30:.3g} GiB at batch 1"
        )
    return int((memory_limit_bytes - fixed) // per_sample)


