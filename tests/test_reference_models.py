"""The plain-torch copies of the derived profiles' architectures
(thrifty.runtime.measure.reference): a profile measured from them is set
beside the derived one of the same name, so each must be the architecture
the derivation enumerated: the same parameter total (the published count the
derivation asserts), the same modules (the derived profile's gradient-ready
layers are torchvision module names), the same gradient bytes; and its
batches must be deterministic and of the derived input shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from thrifty.runtime.measure import reference  # noqa: E402
from thrifty.runtime.measure.workloads import load_workload  # noqa: E402

from helpers import load_script  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DERIVED = ROOT / "datasets" / "profiles" / "derived"


def _on_meta(name: str) -> torch.nn.Module:
    with torch.device("meta"):
        return reference.FACTORIES[name]().model


@pytest.mark.parametrize("name", sorted(reference.FACTORIES))
def test_parameters_match_the_published_count_the_derivation_checks(name: str) -> None:
    script = load_script(ROOT / "datasets" / "scripts" / "derive_profiles.py")
    published, _source = script.PUBLISHED_PARAMS[name]
    model = _on_meta(name)
    assert sum(p.numel() for p in model.parameters()) == published


@pytest.mark.parametrize("name", sorted(reference.FACTORIES))
def test_modules_and_gradient_bytes_are_those_of_the_derived_profile(name: str) -> None:
    derived = json.loads((DERIVED / f"{name}__H100.json").read_text())
    model = _on_meta(name)
    modules = dict(model.named_modules())
    derived_layers = {layer["name"]: layer["grad_bytes"] for layer in derived["layers"]}
    for layer, grad_bytes in derived_layers.items():
        assert layer in modules, f"{name}: the derived profile's layer {layer} is not a module here"
        own = sum(p.numel() * p.element_size() for p in modules[layer].parameters(recurse=False))
        assert own == grad_bytes, layer


def test_batches_are_deterministic_images_with_fixed_labels() -> None:
    first, second = reference.resnet18(seed=3), reference.resnet18(seed=3)
    images, labels = first.make_batch(5)
    again, again_labels = second.make_batch(5)
    assert images.shape == (5, 3, 224, 224) and images.dtype == torch.float32
    assert labels.shape == (5,) and int(labels.max()) < 1000
    assert torch.equal(images, again) and torch.equal(labels, again_labels)
    more, more_labels = first.make_batch(64)
    # the same image always carries the same label
    seen: dict[float, int] = {}
    for image, label in zip(more, more_labels):
        assert seen.setdefault(float(image[0, 0, 0]), int(label)) == int(label)
    with pytest.raises(ValueError, match="positive integer"):
        first.make_batch(0)


def test_a_factory_spec_loads_and_trains_one_step() -> None:
    workload = load_workload("thrifty.runtime.measure.reference:resnet18")
    images, labels = workload.make_batch(2)
    loss = workload.loss_fn(workload.model(images), labels)
    loss.backward()
    assert all(p.grad is not None for p in workload.model.parameters())
