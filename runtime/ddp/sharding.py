"""Which samples each rank trains on: data sharded by batch share (Srifty 4.5).

The data is one stream: epoch ``e`` is a permutation of the dataset drawn from
``(seed, e)``, and the stream is those permutations one after another.
Iteration ``t`` consumes stream positions ``[t*B, (t+1)*B)`` of the global
batch ``B``; rank ``r`` with local batch ``b_r`` takes the slice starting at
``o_r = b_0 + ... + b_{r-1}``. So every sample is used exactly once per epoch
whatever the machines and their batches, the data position of a run is just
its iteration count, and a run re-planned onto other machines with other local
batches sees the same global batches in the same order: the concatenation of
the ranks' batches is the single-device batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["rank_offsets", "split_batch", "epoch_permutation", "ShardedStream"]


def rank_offsets(batches: Sequence[int]) -> list[int]:
    """Where each rank's slice of the global batch starts."""
    offsets, at = [], 0
    for b in batches:
        offsets.append(at)
        at += b
    return offsets


def split_batch(batch: int, parts: int) -> list[int]:
    """A machine's batch over its `parts` workers, as even as it goes (the
    first workers take the remainder)."""
    if parts < 1 or batch < parts:
        raise ValueError(f"cannot split a batch of {batch} over {parts} workers (each needs at least 1)")
    base, extra = divmod(batch, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def epoch_permutation(dataset_size: int, seed: int, epoch: int) -> np.ndarray:
    """The sample order of one epoch, the same in every process."""
    return np.random.default_rng([seed, epoch]).permutation(dataset_size)


class ShardedStream:
    """One rank's sample indices, iteration by iteration."""

    def __init__(self, dataset_size: int, global_batch: int, offset: int, batch: int, seed: int = 0):
        if dataset_size < 1:
            raise ValueError("the dataset is empty")
        if offset < 0 or batch < 1 or offset + batch > global_batch:
            raise ValueError(f"rank slice [{offset}, {offset + batch}) is outside the global batch {global_batch}")
        self.dataset_size, self.global_batch = dataset_size, global_batch
        self.offset, self.batch, self.seed = offset, batch, seed
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def indices(self, iteration: int) -> np.ndarray:
        start = iteration * self.global_batch + self.offset
        epoch, slot = divmod(start, self.dataset_size)
        if slot + self.batch <= self.dataset_size:  # the usual case: one slice of one epoch's order
            return self._permutation(epoch)[slot:slot + self.batch].copy()
        positions = np.arange(start, start + self.batch, dtype=np.int64)
        epochs, slots = np.divmod(positions, self.dataset_size)
        out = np.empty(self.batch, dtype=np.int64)
        for epoch in np.unique(epochs):
            mask = epochs == epoch
            out[mask] = self._permutation(int(epoch))[slots[mask]]
        return out

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._epoch, self._order = epoch, epoch_permutation(self.dataset_size, self.seed, epoch)
        return self._order
