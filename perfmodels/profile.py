"""The compute profile of one model on one device: the measured (or derived)
points that the compute-latency model is fitted from (Srifty 4.1).

A profile holds, per local batch size, the mean and standard deviation of the
forward and backward latency; the largest batch that fits in the device's
memory (``max_batch``, Srifty's ``memcap``); a per-iteration constant
(``step_s``: optimizer step, gradient zeroing, data hand-off) that does not
depend on the batch; and the per-layer gradient sizes with the time each
layer's gradient becomes ready, normalized to the backward duration
(``ready_frac``; Srifty 4.1 "gradient exchange timestamps").

File format (JSON, ``format: "thrifty.compute_profile/1"``)::

    {"format": "thrifty.compute_profile/1", "model": "resnet50", "device": "V100",
     "provenance": {"kind": "measured", "command": "thrifty profile ...", "machine": "..."},
     "max_batch": 256, "step_s": 0.004,
     "points": [{"batch": 8, "forward_s": 0.011, "backward_s": 0.022,
                 "forward_sd_s": 0.0004, "backward_sd_s": 0.0009, "repeats": 20}, ...],
     "layers": [{"name": "fc.weight", "grad_bytes": 8192000, "ready_frac": 0.02}, ...]}

``layers`` are listed in the order their gradients become ready in the
backward pass (last layer first); ``ready_frac`` is in [0, 1].

Optional, for devices that share a host's cores (CPU worker processes):

- ``colocated``: ``{"workers": k, "step_s": ..., "points": [...]}``, the same
  sweep measured while ``k`` identical training processes run at once on the
  host, each at the same batch (``thrifty profile --colocated k``). The
  simulator uses it when ``k`` or more such workers share the host: two
  processes on two cores contend for caches and memory bandwidth (each pass
  slower than alone, by how much depends on the model and the host). ``host_cores`` (the host's
  logical CPUs): beyond that many workers the cores are time-shared.
- ``ddp_overhead_s``: what PyTorch DDP adds to an iteration besides the
  allreduce itself: its autograd hooks, copying each gradient into its
  bucket, launching and finishing the bucket collectives, and (in profiles
  measured before 2026-11-27, when the runtime wrapped models with DDP's
  defaults) copying the summed buckets back into the gradients; the runtime
  now keeps gradients as views of the buckets (``gradient_as_bucket_view``,
  `thrifty.runtime.ddp.reweight.data_parallel`), and the profilers time DDP
  as it wraps it. Measured as a DDP world of one
  process against the plain model, iterations interleaved.
- ``buffer_bytes``: the bytes of the model's buffers (not parameters, e.g.
  BatchNorm running statistics), which PyTorch DDP broadcasts from rank 0 at
  the start of every forward pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from thrifty.core.io import read_json, write_json
from thrifty.core.validation import FieldPathError, validate_model

__all__ = [
    "PROFILE_FORMAT",
    "Provenance",
    "ProfilePoint",
    "ColocatedPoints",
    "LayerGrad",
    "ComputeProfile",
    "parse_profile",
    "load_profile",
    "save_profile",
    "profile_document",
]

PROFILE_FORMAT: Final = "thrifty.compute_profile/1"

PositiveSeconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Provenance(_Frozen):
    """Where a data file came from: measured (command, machine), published
    (source) or derived (script, inputs)."""

    kind: Literal["measured", "published", "derived"]
    command: str | None = None
    machine: str | None = None
    source: str | None = None
    script: str | None = None
    inputs: list[str] | str | None = None
    date: str | None = None
    notes: str | list[str] | None = None

    @model_validator(mode="after")
    def _says_where(self) -> "Provenance":
        needed = {"measured": ("command", "machine"), "published": ("source",), "derived": ("script",)}
        for name in needed[self.kind]:
            if not getattr(self, name):
                raise FieldPathError((name,), f"is required: a {self.kind} file must say its {name}")
        return self


class ProfilePoint(_Frozen):
    batch: Annotated[int, Field(gt=0)]
    forward_s: PositiveSeconds
    backward_s: PositiveSeconds
    forward_sd_s: NonNegativeSeconds = 0.0
    backward_sd_s: NonNegativeSeconds = 0.0
    repeats: Annotated[int, Field(ge=1)] = 1


class LayerGrad(_Frozen):
    name: str
    grad_bytes: Annotated[int, Field(gt=0)]
    ready_frac: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class ColocatedPoints(_Frozen):
    workers: Annotated[int, Field(ge=2)]
    host_cores: Annotated[int, Field(ge=1)] | None = None  # the host's logical CPUs
    # whether the workers exchanged their gradients in every iteration, as a run
    # does (`thrifty.runtime.measure.colocated`); profiles before 2026-11-26 did not
    exchange: bool = False
    step_s: NonNegativeSeconds = 0.0
    points: Annotated[list[ProfilePoint], Field(min_length=2)]


class ComputeProfile(_Frozen):
    format: Literal["thrifty.compute_profile/1"] = PROFILE_FORMAT
    model: Annotated[str, Field(min_length=1)]
    device: Annotated[str, Field(min_length=1)]
    provenance: Provenance
    max_batch: Annotated[int, Field(gt=0)]
    step_s: NonNegativeSeconds = 0.0
    points: Annotated[list[ProfilePoint], Field(min_length=2)]
    layers: Annotated[list[LayerGrad], Field(min_length=1)]
    buffer_bytes: Annotated[int, Field(ge=0)] = 0
    ddp_overhead_s: NonNegativeSeconds = 0.0
    colocated: ColocatedPoints | None = None
    extra: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> "ComputeProfile":
        for i, p in enumerate(self.points):
            if p.batch > self.max_batch:
                raise FieldPathError(
                    ("points", i, "batch"),
                    f"batch {p.batch} is beyond the memory limit max_batch {self.max_batch}",
                )
        if len({p.batch for p in self.points}) < 2:
            raise FieldPathError(("points",), "needs points at two or more distinct batch sizes")
        if self.colocated is not None:
            for i, p in enumerate(self.colocated.points):
                if p.batch > self.max_batch:
                    raise FieldPathError(
                        ("colocated", "points", i, "batch"),
                        f"batch {p.batch} is beyond the memory limit max_batch {self.max_batch}",
                    )
            if len({p.batch for p in self.colocated.points}) < 2:
                raise FieldPathError(("colocated", "points"), "needs points at two or more distinct batch sizes")
        return self

    @property
    def total_grad_bytes(self) -> int:
        return sum(layer.grad_bytes for layer in self.layers)

    @property
    def key(self) -> tuple[str, str]:
        return (self.model, self.device)


def parse_profile(data: Any, source: str | None = None) -> ComputeProfile:
    """Validate profile data (already parsed JSON); errors name the JSON path."""
    return validate_model(ComputeProfile, data, source=source)


def load_profile(path: str | Path) -> ComputeProfile:
    """Load and validate a compute profile file."""
    return parse_profile(read_json(path), source=str(path))


def profile_document(profile: ComputeProfile) -> dict[str, Any]:
    """A profile as its file's JSON: the optional parts left out when empty."""
    data = profile.model_dump(mode="json")
    for name in ("extra", "colocated", "buffer_bytes", "ddp_overhead_s"):
        if not data[name]:
            del data[name]
    return data


def save_profile(profile: ComputeProfile, path: str | Path) -> None:
    """Write a profile atomically."""
    write_json(path, profile_document(profile))

