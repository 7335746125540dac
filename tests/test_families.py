"""The accuracy benchmark's held-out model families (`thrifty.runtime.measure.families`):
each builds, draws a batch and trains one step, and every parameter gets a gradient
(DDP without ``find_unused_parameters`` needs it in every iteration)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from thrifty.runtime.measure.families import FAMILIES, HELD_OUT  # noqa: E402
from thrifty.runtime.measure.timing import make_trainer  # noqa: E402
from thrifty.runtime.measure.zoo import FACTORIES  # noqa: E402


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_trains_a_step_with_a_gradient_for_every_parameter(name):
    trainer = make_trainer(torch, FAMILIES[name](), "cpu", None)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    inputs, targets = trainer.batch(1)  # one sample: a mixture of experts leaves most experts without one
    loss = trainer.loss_fn(trainer.model(inputs), targets)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in trainer.model.parameters())
    trainer.optimizer.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))


def test_the_families_are_not_the_zoo_and_the_held_out_are_families():
    assert not set(FAMILIES) & set(FACTORIES)
    assert set(HELD_OUT) <= set(FAMILIES)
