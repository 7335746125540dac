"""What the runtime trains: a `Trainer`, four factories given by the user.

As RubberBand's trials do, a trainer says how to build the model, the
optimizer, the dataset and the loss; the runtime builds them in every worker
process. A trainer is named by an importable factory, ``MODULE:FACTORY``
(``thrifty run --trainer mypkg.jobs:resnet``), that returns a `Trainer`;
keyword arguments for the factory travel as JSON, so the same name works in
worker processes on this host, under torchrun and on other machines.

The loss must average over the batch (PyTorch's default ``reduction="mean"``):
gradient reweighting (Srifty 4.5, `thrifty.runtime.training.reweight`) turns
each rank's mean into its share of the global-batch mean.

Every run reports its training loss (the global-batch mean, reduced over the
ranks) without the trainer doing anything. A trainer may also report metrics
of its own: ``metrics(outputs, targets) -> {"name": value}``, batch means
computed on the training batch it was given (e.g. accuracy); the runtime calls
it only on the iterations it reports (about once a second), so it costs
nothing on the others, and weights each rank's values by its batch share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from thrifty.datasets.errors import ProblemError, ThriftyError

__all__ = ["Trainer", "load_trainer", "trainer_spec"]


@dataclass(frozen=True)
class Trainer:
    """Four factories: ``model() -> nn.Module``, ``optimizer(parameters) ->
    Optimizer``, ``dataset() -> Dataset`` (map-style: ``len`` and
    ``dataset[i] -> (inputs, target)``; a ``TensorDataset`` is sliced
    directly) and ``loss(outputs, targets) -> scalar`` (a batch mean); and
    optionally ``metrics(outputs, targets) -> Mapping[str, float]`` (batch
    means, reported with the loss; outputs are detached)."""

    model: Callable[[], Any]
    optimizer: Callable[[Any], Any]
    dataset: Callable[[], Any]
    loss: Callable[[Any, Any], Any]
    metrics: Callable[[Any, Any], Mapping[str, Any]] | None = field(default=None, kw_only=True)


def trainer_spec(trainer: str | Callable[..., Any]) -> str:
    """The ``MODULE:FACTORY`` name of a trainer factory; a callable must be
    importable under its own module and qualified name."""
    if isinstance(trainer, str):
        return trainer.strip()
    module, name = getattr(trainer, "__module__", None), getattr(trainer, "__qualname__", None)
    if not callable(trainer) or not module or not name or "<" in name or module == "__main__":
        raise ProblemError(
            f"trainer is {trainer!r}, but must be 'module:factory' or a module-level function of an "
            "importable module (worker processes import it by name)"
        )
    return f"{module}:{name}"


def load_trainer(spec: str, args: Mapping[str, Any] | None = None) -> Trainer:
    """Import ``MODULE:FACTORY``, call it with `args` and check that it
    returned a `Trainer`; every failure is a `ProblemError` naming the spec."""
    from thrifty.perfmodels.measure.worlds import resolve_factory

    function = resolve_factory(spec, returns="a Trainer")  # errors name the spec
    try:
        made = function(**dict(args or {}))
    except ThriftyError:
        raise
    except Exception as e:
        raise ProblemError(f"trainer '{spec}' raised {type(e).__name__}: {e}") from e
    if not isinstance(made, Trainer):
        raise ProblemError(
            f"trainer '{spec}' returned a {type(made).__name__}, but must return "
            "thrifty.runtime.training.Trainer(model=..., optimizer=..., dataset=..., loss=...)"
        )
    for name in ("model", "optimizer", "dataset", "loss", "metrics"):
        value = getattr(made, name)
        if not callable(value) and not (name == "metrics" and value is None):
            raise ProblemError(f"trainer '{spec}': {name} is a {type(value).__name__}, but must be callable"
                               + (" or None" if name == "metrics" else ""))
    return made
