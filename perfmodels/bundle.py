"""Profiles measured on a cluster's machines, one per instance type, in one
file: a profile bundle (format ``thrifty.profile_bundle/1``), what
``thrifty profile --cluster`` and ``thrifty profile-scaling --cluster``
write (Srifty profiles each model on each VM type it may rent; RubberBand
profiles scaling on the cluster it will run on).

A problem names a bundle as it names a single profile file: a training
problem's ``model`` (each instance type of the problem that the bundle holds
is priced with its own profile, `thrifty.perfmodels.library.ModelLibrary`),
a tuning problem's ``model`` (the scaling profile of each of its types, and
the SCALE and INIT latencies measured on it where the problem's ``cloud``
does not state them)::

    {"format": "thrifty.profile_bundle/1", "kind": "compute", "model": "mlp",
     "cluster": "127.0.0.1:6379", "market": "spot", "date": "2026-11-26",
     "command": "thrifty profile ... --cluster ... --instance-types local-a,local-b",
     "profiles": {"local-a": {<a thrifty.compute_profile/1 document>}, "local-b": {...}},
     "machines": {"local-a": {"count": 1, "scale_latency_s": 0.02, "init_latency_s": 1.9,
                              "launch_to_ready_s": 1.92, "machine_s": 41.3, "usd_per_hour": 0.4,
                              "cost_usd": 0.00459}, ...},
     "total_cost_usd": 0.0102}

``kind: "scaling"`` bundles hold ``thrifty.scaling_profile/1`` documents.
Per type, ``machines`` records how the profile was paid for: how many
machines of the type the measurement took, the launch-to-ready time split in
``scale_latency_s`` (from asking the provider for the machines until it
handed them over: running and, on a cluster the driver grows, joined to it)
and ``init_latency_s`` (from then until a worker rank was ready on every one
of them), the machine-seconds they were held (from asking for them to giving
them back, each machine), the catalog's price per hour in the bundle's
market and ``cost_usd = machine_s x usd_per_hour / 3600``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import Field, model_validator

from thrifty.core.errors import ProblemError
from thrifty.core.io import read_json
from thrifty.core.validation import FieldPathError, FileSchema, validate_model
from thrifty.perfmodels.profile import ComputeProfile, parse_profile
from thrifty.perfmodels.scaling import ScalingProfile, ScalingProfileFile, load_scaling_profile, parse_scaling_profile

__all__ = ["BUNDLE_FORMAT", "MachineRecord", "ProfileBundle", "is_bundle", "parse_bundle", "load_bundle",
           "scaling_profile_of"]

BUNDLE_FORMAT: Final = "thrifty.profile_bundle/1"

Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1)]


class MachineRecord(FileSchema):
    """What measuring one type's profile took: its machines, their latencies and their cost."""

    count: Annotated[int, Field(gt=0)]
    scale_latency_s: Seconds
    init_latency_s: Seconds
    launch_to_ready_s: Seconds
    machine_s: Seconds
    usd_per_hour: Seconds
    cost_usd: Seconds


class ProfileBundle(FileSchema):
    """A profile bundle file (see the module docstring)."""

    format: Literal["thrifty.profile_bundle/1"]
    kind: Literal["compute", "scaling"]
    model: Name
    cluster: str | None = None
    market: Literal["on_demand", "spot"] = "on_demand"
    date: str | None = None
    command: str | None = None
    profiles: Annotated[dict[Name, dict[str, Any]], Field(min_length=1)]
    machines: dict[Name, MachineRecord] = {}
    total_cost_usd: Seconds = 0.0

    @model_validator(mode="after")
    def _profiles_check(self) -> "ProfileBundle":
        for name, document in self.profiles.items():
            try:
                profile: Any = (parse_profile(document) if self.kind == "compute"
                                else validate_model(ScalingProfileFile, document))
            except Exception as e:  # noqa: BLE001 - ProblemError: re-raised under the bundle's path
                message = getattr(e, "message", str(e))
                raise FieldPathError(("profiles", name), message) from None
            if profile.model != self.model:
                raise FieldPathError(("profiles", name, "model"),
                                     f"is '{profile.model}', but the bundle is of model '{self.model}'")
            if self.kind == "scaling" and profile.instance_type != name:
                raise FieldPathError(("profiles", name, "instance_type"),
                                     f"is '{profile.instance_type}', but the profile is listed under '{name}'")
        unknown = sorted(set(self.machines) - set(self.profiles))
        if unknown:
            raise FieldPathError(("machines", unknown[0]), "names a type the bundle has no profile of")
        return self

    def compute_profiles(self) -> dict[str, ComputeProfile]:
        """Instance type -> its compute profile (a ``compute`` bundle)."""
        return {name: parse_profile(doc) for name, doc in self.profiles.items()}

    def scaling_document(self, instance_type: str) -> dict[str, Any] | None:
        """The scaling profile document of `instance_type`, None when the bundle has none."""
        return self.profiles.get(instance_type)


def is_bundle(data: Any) -> bool:
    """Whether parsed JSON claims to be a profile bundle."""
    return isinstance(data, dict) and data.get("format") == BUNDLE_FORMAT


def parse_bundle(data: Any, source: str | None = None) -> ProfileBundle:
    """Check bundle data (parsed JSON); an error names the JSON path of the bad field."""
    return validate_model(ProfileBundle, data, source=source)


def load_bundle(path: str | Path) -> ProfileBundle:
    return parse_bundle(read_json(path), source=str(path))


@lru_cache(maxsize=16)
def _bundle_at(path: str) -> ProfileBundle | None:
    """The bundle in file `path`, or None when the file is not one (checked once per file)."""
    data = read_json(path)
    return parse_bundle(data, source=path) if is_bundle(data) else None


def scaling_profile_of(model: str, instance_type: str) -> tuple[ScalingProfile, MachineRecord | None]:
    """The scaling profile a tuning problem's `model` names for `instance_type`
    (`thrifty.perfmodels.scaling.load_scaling_profile`: a shipped name or a
    profile file; or a ``scaling`` bundle, its profile of that type), and what
    measuring it on that type's machines recorded (a bundle's; else None)."""
    bundle = _bundle_at(model) if model.endswith(".json") else None
    if bundle is None:
        return load_scaling_profile(model, instance_type), None
    if bundle.kind != "scaling":
        raise ProblemError(f"is a bundle of {bundle.kind} profiles; a tuning problem needs scaling profiles "
                           "(thrifty profile-scaling --cluster)", path="model", source=model)
    document = bundle.scaling_document(instance_type)
    if document is None:
        raise ProblemError(f"the profile bundle {model} has no profile of {instance_type}; it has "
                           f"{', '.join(sorted(bundle.profiles))}", path="model")
    return parse_scaling_profile(document, f"{model} ({instance_type})"), bundle.machines.get(instance_type)
