"""Find compute models by (model, device) among the shipped profiles or files.

Shipped profiles live in ``datasets/profiles/{measured,derived}/`` named
``<model>__<device>.json``; a measured profile wins over a derived one for the
same key. A user can add profile files or folders; a name that no profile
answers is an error listing what is available.

A profile bundle (`thrifty.perfmodels.bundle`: profiles measured on a
cluster's machines, one per instance type) adds each profile for its own
instance type: `get` with that type answers with it, whatever other type
shares its device. Its device key is ``DEVICE@TYPE`` (``cpu@local-a``), so
that what the simulators keep per compute model stays apart for two types of
one device. A device that one type of the bundle has also answers for the
other types of that device (a V100 measured on p3.2xlarge prices a
p3.8xlarge's V100s); a device that several have answers for none of the
others (an error, not a shipped profile of that device).

`source_of` says where the profile `get` answers with came from (a
`thrifty.perfmodels.provenance.FigureSource`: the profile's own provenance
record and the file that holds it), and says FALLBACK when a bundle a
problem named has no profile of the type and another profile answers it.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from thrifty.core.errors import ProblemError, closest_names
from thrifty.core.io import read_json
from thrifty.datasets.paths import profile_files
from thrifty.perfmodels.compute import ComputeModel, load_compute_model
from thrifty.perfmodels.provenance import FigureSource, display_path, from_record

__all__ = ["ModelLibrary", "shipped_library"]


def _key_of(path: Path) -> tuple[str, str] | None:
    stem = path.stem
    if "__" not in stem:
        return None
    model, device = stem.rsplit("__", 1)
    return model, device


class ModelLibrary:
    """Compute models by (model, device), loaded lazily and cached."""

    def __init__(self, paths: list[Path] | None = None):
        self._paths: dict[tuple[str, str], Path] = {}
        self._models: dict[tuple[str, str], ComputeModel] = {}
        self._typed: dict[tuple[str, str], ComputeModel] = {}  # (model, instance type) -> from a bundle
        self._shared: dict[tuple[str, str], list[str]] = {}  # (model, device) -> the bundle's types of that device
        self._files: dict[tuple[str, str], str] = {}  # (model, device or instance type) -> the file of its profile
        self._carried: dict[tuple[str, str], str] = {}  # (model, device) -> the bundle's type it was measured on
        for p in paths if paths is not None else profile_files():
            key = _key_of(p)
            if key is not None and key not in self._paths:
                self._paths[key] = p

    def add(self, model: ComputeModel, file: str | Path | None = None) -> None:
        """Add (or override) a compute model, e.g. one loaded from a user's
        `file`, or one corrected online (its provenance record says so)."""
        key = (model.model, model.device)
        self._models[key] = model
        self._carried.pop(key, None)
        if file is None:
            self._files.pop(key, None)
        else:
            self._files[key] = display_path(file)

    def add_file(self, path: str | Path) -> ComputeModel:
        """Add a profile or compute model file, or every profile of a bundle
        (see the module docstring); returns the (first) model added."""
        from thrifty.perfmodels.bundle import is_bundle  # only a file a user names can be one

        data = read_json(path)
        if is_bundle(data):
            return self._add_bundle(data, str(path))
        model = load_compute_model(path)
        self.add(model, file=path)
        return model

    def add_typed(self, model: ComputeModel, instance_type: str) -> None:
        """Add `model` as measured on `instance_type`: `get` with that type
        answers with it, whatever other type shares its device."""
        self._typed[(model.model, instance_type)] = replace(model, device=f"{model.device}@{instance_type}")

    def _add_bundle(self, data: dict, source: str) -> ComputeModel:
        from thrifty.perfmodels.bundle import parse_bundle

        bundle = parse_bundle(data, source=source)
        if bundle.kind != "compute":
            raise ProblemError(f"is a bundle of {bundle.kind} profiles; a training problem needs compute profiles "
                               "(thrifty profile --cluster)", path="model", source=source)
        typed = {name: ComputeModel.from_profile(p) for name, p in bundle.compute_profiles().items()}
        devices: dict[str, list[ComputeModel]] = {}
        for name, model in typed.items():
            devices.setdefault(model.device, []).append(model)
            self.add_typed(model, name)
            self._files[(model.model, name)] = display_path(source)
        for device, models in devices.items():
            if len(models) == 1:
                self.add(models[0], file=source)
                self._carried[(models[0].model, device)] = next(n for n, m in typed.items() if m is models[0])
            else:
                self._shared[(models[0].model, device)] = [n for n, m in typed.items() if m.device == device]
        return next(iter(typed.values()))

    def keys(self) -> list[tuple[str, str]]:
        typed = {(m, cm.device) for (m, _t), cm in self._typed.items()}
        return sorted(set(self._paths) | set(self._models) | typed)

    def models(self) -> list[str]:
        return sorted({m for m, _ in self.keys()})

    def devices(self, model: str) -> list[str]:
        return sorted({d for m, d in self.keys() if m == model})

    def get(self, model: str, device: str, instance_type: str | None = None) -> ComputeModel:
        """The compute model of `model` on `device`; the one measured on
        `instance_type` itself when a bundle added one."""
        typed = self._typed.get((model, instance_type)) if instance_type is not None else None
        if typed is not None:
            return typed
        key = (model, device)
        if key in self._shared:
            raise ProblemError(
                f"the profile bundle of '{model}' holds profiles of {', '.join(self._shared[key])} on device "
                f"'{device}', which differ, and none of {instance_type or 'this type'}: measure it there too "
                "(thrifty profile --cluster) or name a profile of it")
        if key in self._models:
            return self._models[key]
        if key not in self._paths:
            raise self._missing(model, device)
        loaded = load_compute_model(self._paths[key])
        if (loaded.model, loaded.device) != key:
            raise ProblemError(
                f"file name says model '{model}' on device '{device}' but the profile is "
                f"'{loaded.model}' on '{loaded.device}'",
                source=str(self._paths[key]),
            )
        self._models[key] = loaded
        self._files[key] = display_path(self._paths[key])
        return loaded

    def source_of(self, model: str, device: str, instance_type: str | None = None) -> FigureSource:
        """Where the compute profile `get` answers with for `instance_type`
        came from (the module docstring): its provenance record, its file,
        the bundle type a device was measured on, and a FALLBACK when a
        bundle of `model` lacks the type."""
        cm = self.get(model, device, instance_type)
        if instance_type is not None and (model, instance_type) in self._typed:
            return from_record(cm.provenance, "compute profile", self._files.get((model, instance_type)))
        key = (model, device)
        source = from_record(cm.provenance, "compute profile", self._files.get(key))
        carried = self._carried.get(key)
        if carried is not None and carried != instance_type:
            source = source.with_note(f"measured on {carried}, a type of the same device ({device})")
        bundles = sorted({self._files[(m, t)] for m, t in self._typed if m == model})
        if instance_type is not None and bundles and carried is None:
            why = f"the profile bundle {', '.join(bundles)} has no profile of {instance_type}"
            source = source.passed_on(why, named=True)
        return source

    def _missing(self, model: str, device: str) -> ProblemError:
        if model not in self.models():
            close = closest_names(model, self.models())
            hint = f"; closest: {', '.join(close)}" if close else ""
            return ProblemError(
                f"no compute profile for model '{model}'{hint}; available models: "
                f"{', '.join(self.models()) or '(none)'}"
            )
        return ProblemError(
            f"no compute profile for model '{model}' on device '{device}'; "
            f"'{model}' has profiles for: {', '.join(self.devices(model))}"
        )


@lru_cache(maxsize=1)
def shipped_library() -> ModelLibrary:
    """The library of profiles shipped in thrifty.datasets (cached)."""
    return ModelLibrary()
