"""What the runtime trains: a job named ``MODULE:FUNCTION`` (or
``path/to/file.py:FUNCTION``, a file imported by its path), written one of
two ways: a loop function (the user's own training code, run once per rank
with a `thrifty.runtime.ddp.context.JobContext`; that module states the
contract), or a `Trainer`, four factories given by the user, the short form,
which the runtime runs as a loop function of its own
(`thrifty.runtime.ddp.loop.trainer_loop`). `resolve_job` tells the two apart.

As RubberBand's trials do, a trainer says how to build the model, the
optimizer, the dataset and the loss; the runtime builds them in every worker
process. A trainer is named by an importable factory, ``MODULE:FACTORY``
(``thrifty run --trainer mypkg.jobs:resnet``), that returns a `Trainer`;
keyword arguments for the factory travel as JSON, so the same name works in
worker processes on this host, under torchrun and on other machines.

The loss must average over the batch (PyTorch's default ``reduction="mean"``):
gradient reweighting (Srifty 4.5, `thrifty.runtime.ddp.reweight`) turns
each rank's mean into its share of the global-batch mean.

Every run reports its training loss (the global-batch mean, reduced over the
ranks) without the trainer doing anything. A trainer may also report metrics
of its own: ``metrics(outputs, targets) -> {"name": value}``, batch means
computed on the training batch it was given (e.g. accuracy); the runtime calls
it only on the iterations it reports (about once a second), so it costs
nothing on the others, and weights each rank's values by its batch share.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from thrifty.core.errors import ProblemError, ThriftyError

__all__ = ["Trainer", "TunableTrainer", "load_trainer", "load_tunable_trainer", "trainer_spec", "JobCode",
           "resolve_job", "is_loop_function", "check_loop_arguments", "loop_batch_size"]


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


@dataclass(frozen=True)
class TunableTrainer(Trainer):
    """A `Trainer` plus what tuning needs: `metric(model) -> float`
    (validation accuracy or any higher-is-better score, computed on the
    unwrapped model in eval mode without gradients), the global `batch_size`
    and the optimizer steps of one iteration (None: one pass over the dataset).

    The factory (``MODULE:FACTORY``) is called with the trial's configuration
    as keyword arguments, in every worker process."""

    metric: Callable[[Any], float]
    batch_size: int = 32
    steps_per_iteration: int | None = None


def trainer_spec(trainer: str | Callable[..., Any]) -> str:
    """The name of a job every process resolves alike: ``MODULE:FUNCTION``,
    or ``/absolute/path/file.py:FUNCTION`` (a file's path made absolute from
    the current folder, `thrifty.core.optional.absolute_spec`); a callable
    must be importable under its own module (or file) and qualified name."""
    from thrifty.core.optional import absolute_spec

    if isinstance(trainer, str):
        return absolute_spec(trainer)
    module, name = getattr(trainer, "__module__", None), getattr(trainer, "__qualname__", None)
    source = getattr(sys.modules.get(module or ""), "__file__", None)
    if module and module.startswith("_thrifty_file_") and source and name and "<" not in name:
        return f"{source}:{name}"  # a function of a file imported by its path
    if not callable(trainer) or not module or not name or "<" in name or module == "__main__":
        raise ProblemError(
            f"trainer is {trainer!r}, but must be 'module:factory' or a module-level function of an "
            "importable module (worker processes import it by name)"
        )
    return f"{module}:{name}"


def load_trainer(spec: str, args: Mapping[str, Any] | None = None) -> Trainer:
    """Import ``MODULE:FACTORY``, call it with `args` and check that it
    returned a `Trainer`; every failure is a `ProblemError` naming the spec."""
    from thrifty.runtime.worlds import resolve_factory

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


def load_tunable_trainer(spec: str, config: Mapping[str, Any] | None = None) -> TunableTrainer:
    """`load_trainer`, for a factory that must return a `TunableTrainer`
    (a tuning trial's, called with the trial's configuration)."""
    made = load_trainer(spec, config)
    if not isinstance(made, TunableTrainer):
        raise ProblemError(f"trainer '{spec}' returned a {type(made).__name__}, but the tuning runtime needs a "
                           "thrifty.runtime.tuning.TunableTrainer (a Trainer with metric=... for validation)")
    if not callable(made.metric):
        raise ProblemError(f"trainer '{spec}': metric is a {type(made.metric).__name__}, but must be callable")
    if not isinstance(made.batch_size, int) or made.batch_size < 1:
        raise ProblemError(f"trainer '{spec}': batch_size is {made.batch_size!r}, but must be a positive integer")
    steps = made.steps_per_iteration
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ProblemError(f"trainer '{spec}': steps_per_iteration is {steps!r}, but must be a positive integer "
                           "or None")
    return made


@dataclass(frozen=True)
class JobCode:
    """What a job's name resolved to: a loop function (`loop`, called as
    ``loop(ctx, **args)``) or the `Trainer` its factory returned (`trainer`)."""

    spec: str
    args: Mapping[str, Any]
    loop: Callable[..., Any] | None = None
    trainer: Trainer | None = None


def is_loop_function(function: Callable[..., Any], args: Mapping[str, Any] | None = None) -> bool:
    """Is `function` a loop function rather than a `Trainer` factory? A loop
    function takes the job's context as its first parameter: one annotated
    ``JobContext``, or else a positional parameter without a default that
    `args` does not name. A factory takes only its keyword arguments (all of
    them given in `args` or defaulted)."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin or a class without a signature: a factory
        return False
    if not parameters or parameters[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                    inspect.Parameter.POSITIONAL_OR_KEYWORD):
        return False
    first = parameters[0]
    annotation = first.annotation if isinstance(first.annotation, str) else getattr(first.annotation, "__name__", "")
    if annotation.strip("'\"").rsplit(".", 1)[-1] == "JobContext":
        return True
    return first.default is inspect.Parameter.empty and first.name not in (args or {})


def resolve_job(spec: str, args: Mapping[str, Any] | None = None, tunable: bool = False) -> JobCode:
    """The code a job names: its loop function, or the `Trainer` (a
    `TunableTrainer` when `tunable`) its factory returns; every failure is a
    `ProblemError` naming the spec. Imports the user's module, but no torch."""
    from thrifty.runtime.worlds import resolve_factory

    args = dict(args or {})
    function = resolve_factory(spec, returns="a Trainer, or a loop function taking the job's context")
    if is_loop_function(function, args):
        return JobCode(spec, args, loop=function)
    return JobCode(spec, args, trainer=load_tunable_trainer(spec, args) if tunable else load_trainer(spec, args))


def check_loop_arguments(spec: str, loop: Callable[..., Any], args: Mapping[str, Any]) -> None:
    """A `ProblemError` naming the job when `loop` cannot be called as
    ``loop(ctx, **args)`` (an unknown argument, a required one missing), so a
    run says so before it starts any process."""
    try:
        inspect.signature(loop).bind(None, **dict(args))
    except TypeError as e:
        raise ProblemError(f"job '{spec}' cannot take the arguments {dict(args)}: {e}", path="trainer_args") from None


def loop_batch_size(spec: str, loop: Callable[..., Any], args: Mapping[str, Any]) -> int:
    """The global batch of a tuning trial whose job is the loop function
    `loop`, called with `args` (the trial's configuration and the fixed
    arguments): ``args["batch_size"]`` when the configuration has one, else
    the default of the loop's ``batch_size`` parameter; a `ProblemError`
    naming the job when neither is a positive integer (a trial's batch is
    the same on every number of ranks, as a `TunableTrainer`'s is)."""
    if "batch_size" in args:
        value, where = args["batch_size"], "its configuration's batch_size"
    else:
        try:
            parameter = inspect.signature(loop).parameters.get("batch_size")
        except (TypeError, ValueError):
            parameter = None
        if parameter is None or parameter.default is inspect.Parameter.empty:
            raise ProblemError(f"job '{spec}' is a loop function with no global batch for its trials: give "
                               "batch_size in the search space (or trainer_args), or a default to the loop's "
                               "batch_size parameter")
        value, where = parameter.default, "the default of its batch_size parameter"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProblemError(f"job '{spec}': {where} is {value!r}, but a trial's global batch must be a positive "
                           "integer")
    return value
