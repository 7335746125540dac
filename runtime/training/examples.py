"""Example trainers (``thrifty run PLAN.json --trainer thrifty.runtime.training.examples:zoo``).

- `tiny_mlp`: a two-layer perceptron on a small synthetic classification set,
  float64 by default; the tests use it to check gradient reweighting and exact
  resumption to 1e-6 and bit for bit.
- `mlp_loop`: a loop function (the job contract, `thrifty.runtime.ddp.context`)
  on `tiny_mlp`'s model and data, with a OneCycle learning-rate schedule and
  gradient clipping; the tests run it through re-plans against one process.
- `zoo`: one of the profiled zoo models (`thrifty.runtime.measure.zoo`: ``mlp``,
  ``small-cnn``, ``tiny-transformer``) on a fixed synthetic dataset drawn from
  that model's own input stream and teacher labels. A problem that names the
  same model (``"model": "tiny-transformer"``) is planned with that model's
  measured CPU profile, so the plan predicts the work these workers do.

Both report the training loss (every trainer does) and the accuracy on the
training batch (their `metrics`), which the live progress bar of
``thrifty run`` and the run log show as training goes.

This module does not import torch; the factories' parts do when called.
"""

from __future__ import annotations

from typing import Any

from thrifty.runtime.ddp.trainer import Trainer

__all__ = ["tiny_mlp", "zoo", "mlp_loop"]

_DTYPES = ("float32", "float64")


def _dtype(name: str) -> Any:
    import torch

    if name not in _DTYPES:
        raise ValueError(f"dtype is '{name}', but must be one of {', '.join(_DTYPES)}")
    return getattr(torch, name)


def _sgd(lr: float, momentum: float):
    def make(parameters: Any) -> Any:
        import torch

        return torch.optim.SGD(parameters, lr=lr, momentum=momentum)

    return make


def _cross_entropy(outputs: Any, targets: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(outputs, targets)


def _accuracy(outputs: Any, targets: Any) -> dict[str, float]:
    """The share of the batch whose highest-scoring class is the target
    (for sequence outputs ``(batch, positions, classes)``, of every position)."""
    return {"accuracy": (outputs.argmax(dim=-1) == targets).float().mean().item()}


def tiny_mlp(features: int = 8, hidden: int = 16, classes: int = 4, samples: int = 240, dtype: str = "float64",
             lr: float = 0.1, momentum: float = 0.9, seed: int = 0) -> Trainer:
    """``Linear(features, hidden) -> Tanh -> Linear(hidden, classes)`` on
    `samples` Gaussian points labelled by a fixed random linear teacher."""
    torch_dtype = _dtype(dtype)

    def model() -> Any:
        return _mlp(features, hidden, classes, torch_dtype, seed)

    def dataset() -> Any:
        return _teacher_data(features, classes, samples, torch_dtype, seed)

    return Trainer(model=model, optimizer=_sgd(lr, momentum), dataset=dataset, loss=_cross_entropy,
                   metrics=_accuracy)


def _mlp(features: int, hidden: int, classes: int, dtype: Any, seed: int) -> Any:
    import torch
    from torch import nn

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, classes)).to(dtype)


def _teacher_data(features: int, classes: int, samples: int, dtype: Any, seed: int) -> Any:
    """`samples` Gaussian points labelled by a fixed random linear teacher."""
    import torch
    from torch.utils.data import TensorDataset

    generator = torch.Generator().manual_seed(seed + 1)
    inputs = torch.randn(samples, features, generator=generator, dtype=dtype)
    teacher = torch.randn(features, classes, generator=generator, dtype=dtype)
    return TensorDataset(inputs, (inputs @ teacher).argmax(dim=1))


def mlp_loop(ctx: Any, features: int = 8, hidden: int = 16, classes: int = 4, samples: int = 240,
             dtype: str = "float64", lr: float = 0.1, momentum: float = 0.9, clip: float = 1.0,
             seed: int = 0) -> None:
    """A loop function, written as a user writes one (the job contract:
    `thrifty.runtime.ddp.context`): `tiny_mlp`'s model and data, SGD with
    momentum under a OneCycle learning-rate schedule over the job's
    iterations, gradient clipping, the loss and accuracy reported every
    iteration with the loop's state (model, optimizer, schedule) as its
    checkpoint."""
    import torch
    import torch.nn.functional as F

    model = _mlp(features, hidden, classes, _dtype(dtype), seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=ctx.iterations)
    state = ctx.restore()
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
    model = ctx.prepare_model(model)
    checkpoint = {"model": model, "optimizer": optimizer, "schedule": schedule}
    for inputs, targets in ctx.prepare_loader(_teacher_data(features, classes, samples, _dtype(dtype), seed)):
        optimizer.zero_grad()
        outputs = model(inputs)
        loss = F.cross_entropy(outputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        schedule.step()
        ctx.report({"loss": loss.item(), **_accuracy(outputs, targets)}, checkpoint=checkpoint)


def zoo(model: str = "tiny-transformer", samples: int = 4096, lr: float = 1e-3, momentum: float = 0.9,
        seed: int = 0) -> Trainer:
    """A profiled zoo model (``mlp``, ``small-cnn``, ``tiny-transformer``) on
    `samples` synthetic examples from its own stream."""
    from thrifty.runtime.measure import FACTORIES

    if model not in FACTORIES:
        raise ValueError(f"model is '{model}', but must be one of {', '.join(FACTORIES)}")

    def workload() -> Any:
        return FACTORIES[model](seed=seed)

    def make_model() -> Any:
        return workload().model

    def dataset() -> Any:
        from torch.utils.data import TensorDataset

        inputs, targets = workload().make_batch(samples)
        return TensorDataset(inputs, targets)

    return Trainer(model=make_model, optimizer=_sgd(lr, momentum), dataset=dataset, loss=_cross_entropy,
                   metrics=_accuracy)
