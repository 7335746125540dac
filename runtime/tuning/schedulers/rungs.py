"""Rungs of asynchronous successive halving (HyperSched 3.3, Fig. 2; ASHA).

A rung at `milestone` iterations records the score each trial had when it
reached the milestone; a trial is in the top ``k`` of the rung when fewer than
``k`` recorded scores are strictly better than its own (ties favour staying).
ASHA's cut is ``k = floor(n / eta)`` of the ``n`` trials recorded so far
(Algorithm 2); HyperSched's speculative cut is the top 1/eta of all trials
*seen*, rounded up so that a rung's first arrival continues,
``k = ceil(n / eta)`` (4.2). Each rung also keeps its paused trials ordered
best first, the queue of Fig. 2 from which promotions are drawn.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator

__all__ = ["Rung", "asha_top_k", "speculative_top_k"]


def asha_top_k(n: int, eta: float) -> int:
    """ASHA (Algorithm 2): the top floor(n / eta) of a rung's n recorded trials continue."""
    return math.floor(n / eta + 1e-12)


def speculative_top_k(n: int, eta: float) -> int:
    """HyperSched 4.2: the top 1/eta of all seen trials, at least the first arrival."""
    return math.ceil(n / eta - 1e-12)


class Rung:
    def __init__(self, milestone: int):
        self.milestone = milestone
        self.scores: dict[int, float] = {}
        self._ascending: list[float] = []
        self._paused: list[tuple[float, int]] = []  # (-score, trial_id), best first

    def __len__(self) -> int:
        return len(self.scores)

    def record(self, trial_id: int, score: float) -> None:
        """Record `trial_id`'s score at this milestone (the first one only)."""
        if trial_id not in self.scores:
            self.scores[trial_id] = score
            bisect.insort(self._ascending, score)

    def better_than(self, score: float) -> int:
        """How many recorded scores are strictly higher than `score`."""
        return len(self._ascending) - bisect.bisect_right(self._ascending, score)

    def in_top(self, trial_id: int, k: int) -> bool:
        return self.better_than(self.scores[trial_id]) < k

    def add_paused(self, trial_id: int) -> None:
        bisect.insort(self._paused, (-self.scores[trial_id], trial_id))

    def remove_paused(self, trial_id: int) -> None:
        entry = (-self.scores[trial_id], trial_id)
        i = bisect.bisect_left(self._paused, entry)
        if i < len(self._paused) and self._paused[i] == entry:
            del self._paused[i]

    def best_paused(self) -> int | None:
        return self._paused[0][1] if self._paused else None

    def paused_best_first(self) -> Iterator[int]:
        """Paused trials, best first (a snapshot: safe to resume while iterating)."""
        return (tid for _, tid in list(self._paused))
