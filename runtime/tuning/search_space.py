"""Hyperparameter generators: random, grid, fixed lists and user callables.

HyperDrive's hyperparameter generator (4.2) is pluggable behind one call,
``createJob() -> (jobID, hyperparameters)``; here `SearchSpace.next_config()`
returns the next configuration, or None when a finite space is exhausted. The
loop numbers trials in the order configurations come out, so two schedulers
given generators with the same seed see the same configuration order
(HyperSched 6: "the same ordering of hyperparameter configurations among
comparisons"; HyperDrive 6.1: "the same random search Hyperparameter
Generator with the same initial random seed").

Domains for random search: `Uniform`, `LogUniform`, `IntUniform`, `Choice`,
`Exponential` (HyperSched's synthetic ``b0 ~ Exponential(scale 0.1)``);
any other value is a constant. Grid search takes a list of values per name and
walks the cartesian product in order (last name fastest).
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from thrifty.core.errors import ProblemError

__all__ = [
    "Domain", "Uniform", "LogUniform", "IntUniform", "Choice", "Exponential",
    "SearchSpace", "RandomSearch", "GridSearch", "ConfigList", "CallableSearch",
]


class Domain(ABC):
    @abstractmethod
    def sample(self, rng: np.random.Generator) -> Any: ...


def _check_range(name: str, low: float, high: float, *, positive: bool = False) -> None:
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ProblemError(f"range [{low}, {high}] is empty or not finite", path=name)
    if positive and low <= 0:
        raise ProblemError(f"lower bound {low} must be positive for a log-uniform domain", path=name)


@dataclass(frozen=True)
class Uniform(Domain):
    low: float
    high: float

    def __post_init__(self) -> None:
        _check_range("Uniform", self.low, self.high)

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))


@dataclass(frozen=True)
class LogUniform(Domain):
    low: float
    high: float

    def __post_init__(self) -> None:
        _check_range("LogUniform", self.low, self.high, positive=True)

    def sample(self, rng: np.random.Generator) -> float:
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))


@dataclass(frozen=True)
class IntUniform(Domain):
    """An integer in [low, high], both included."""

    low: int
    high: int

    def __post_init__(self) -> None:
        _check_range("IntUniform", self.low, self.high)

    def sample(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.low, self.high + 1))


@dataclass(frozen=True)
class Choice(Domain):
    values: tuple[Any, ...]

    def __init__(self, values: Sequence[Any]):
        if len(values) == 0:
            raise ProblemError("a choice needs at least one value", path="Choice")
        object.__setattr__(self, "values", tuple(values))

    def sample(self, rng: np.random.Generator) -> Any:
        return self.values[int(rng.integers(len(self.values)))]


@dataclass(frozen=True)
class Exponential(Domain):
    scale: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ProblemError(f"scale is {self.scale}, but must be positive", path="Exponential")

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.scale))


class SearchSpace(ABC):
    """A source of configurations, consumed in order by the loop."""

    @abstractmethod
    def next_config(self) -> dict[str, Any] | None:
        """The next configuration, or None when there is none left."""

    def has_more(self) -> bool:
        """Whether `next_config()` would return a configuration."""
        return True


class RandomSearch(SearchSpace):
    """Independent draws from each domain, seeded; at most `max_configs` of them."""

    def __init__(self, space: Mapping[str, Any], *, seed: int = 0, max_configs: int | None = None):
        if not space:
            raise ProblemError("the search space is empty: give at least one hyperparameter", path="space")
        if max_configs is not None and (not isinstance(max_configs, int) or max_configs < 1):
            raise ProblemError(f"`max_configs` is {max_configs!r}, but must be a positive integer",
                               path="max_configs")
        self._space = dict(space)
        self._rng = np.random.default_rng(seed)
        self._left = max_configs

    def has_more(self) -> bool:
        return self._left is None or self._left > 0

    def next_config(self) -> dict[str, Any] | None:
        if not self.has_more():
            return None
        if self._left is not None:
            self._left -= 1
        return {k: (v.sample(self._rng) if isinstance(v, Domain) else v) for k, v in self._space.items()}


class GridSearch(SearchSpace):
    """Every combination of the listed values, in order (the last name varies fastest)."""

    def __init__(self, grid: Mapping[str, Sequence[Any]]):
        if not grid:
            raise ProblemError("the search space is empty: give at least one hyperparameter", path="grid")
        for name, values in grid.items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise ProblemError(f"must be a list of values, got {type(values).__name__}", path=f"grid.{name}")
            if len(values) == 0:
                raise ProblemError("has no values: the grid would be empty", path=f"grid.{name}")
        names = list(grid)
        self._it: Iterator[tuple[Any, ...]] = itertools.product(*(grid[n] for n in names))
        self._names = names
        self._next = next(self._it, None)

    def has_more(self) -> bool:
        return self._next is not None

    def next_config(self) -> dict[str, Any] | None:
        if self._next is None:
            return None
        config = dict(zip(self._names, self._next))
        self._next = next(self._it, None)
        return config


class ConfigList(SearchSpace):
    """The given configurations, in the given order (a trace's configuration order)."""

    def __init__(self, configs: Sequence[Mapping[str, Any]]):
        if len(configs) == 0:
            raise ProblemError("the search space is empty: the list of configurations has none", path="configs")
        self._configs = [dict(c) for c in configs]
        self._i = 0

    def has_more(self) -> bool:
        return self._i < len(self._configs)

    def next_config(self) -> dict[str, Any] | None:
        if not self.has_more():
            return None
        self._i += 1
        return dict(self._configs[self._i - 1])


class CallableSearch(SearchSpace):
    """A user generator: ``fn(index, rng) -> dict | None`` (None: no more configurations).

    `index` counts the configurations asked for so far (0, 1, ...); `rng` is a
    seeded numpy Generator owned by this search space.
    """

    def __init__(self, fn: Callable[[int, np.random.Generator], Mapping[str, Any] | None], *, seed: int = 0):
        if not callable(fn):
            raise ProblemError(f"the generator must be callable, got {type(fn).__name__}", path="generator")
        self._fn = fn
        self._rng = np.random.default_rng(seed)
        self._index = 0
        self._buffered: dict[str, Any] | None = None
        self._done = False

    def _fill(self) -> None:
        if self._buffered is None and not self._done:
            config = self._fn(self._index, self._rng)
            if config is None:
                self._done = True
                return
            if not isinstance(config, Mapping):
                raise ProblemError(f"the generator returned {type(config).__name__}, but must return a dict or None",
                                   path="generator")
            self._buffered = dict(config)
            self._index += 1

    def has_more(self) -> bool:
        self._fill()
        return self._buffered is not None

    def next_config(self) -> dict[str, Any] | None:
        self._fill()
        config, self._buffered = self._buffered, None
        return config
