"""Saying when a run's iteration time is off its plan's prediction
(`PredictionOff`), why that is likely, and the ``thrifty profile`` command
that measures the trainer's model (`profile_command`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import computed_field
from pydantic.dataclasses import dataclass as record_dataclass

from thrifty.core.validation import RECORD_CONFIG
from thrifty.runtime.training.faults import Fault, describe_fault

__all__ = ["PredictionOff", "profile_command", "prediction_off_cause", "ZOO_TRAINER"]


@record_dataclass(frozen=True, config=RECORD_CONFIG)
class PredictionOff:
    """Measured and predicted iteration time differ by more than
    `monitor.PREDICTION_OFF_FACTOR` over a steady window: the likely cause,
    and the command that profiles the trainer's model (said once a run)."""

    segment: int
    config: str
    measured_iteration_s: float
    predicted_iteration_s: float
    cause: str
    command: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ratio(self) -> float:
        return self.measured_iteration_s / self.predicted_iteration_s

    def __str__(self) -> str:
        return (f"iteration time {self.measured_iteration_s * 1e3:.1f} ms measured, "
                f"{self.predicted_iteration_s * 1e3:.1f} ms predicted ({self.ratio:.2f}x, segment {self.segment} "
                f"{self.config}): likely {self.cause}; profile the trainer's model with: {self.command}")

ZOO_TRAINER = "thrifty.runtime.training.examples:zoo"  # runs the zoo model its `model` argument names


def profile_command(spec: str, trainer_args: Mapping[str, Any], device: str, threads: int, colocated: int) -> str:
    """The ``thrifty profile`` command that measures what this trainer runs
    (`thrifty.runtime.commands.profile`): its workload factory and name for
    the zoo trainer, else a workload factory of the user's to write (a
    function returning the trainer's model, ``make_batch`` and ``loss_fn``);
    on CPU with `colocated` workers sharing the host, as the run has them."""
    import shlex

    factory, name = "MODULE:WORKLOAD", spec.rsplit(":", 1)[-1].replace("_", "-")
    if spec == ZOO_TRAINER:
        from thrifty.runtime.measure import FACTORIES

        name = str(trainer_args.get("model", "tiny-transformer"))
        if name in FACTORIES:
            factory = f"thrifty.runtime.measure.zoo:{FACTORIES[name].__name__}"
    words = ["thrifty", "profile", factory, "--out", f"{name}__{device}.json", "--name", name,
             "--threads", str(threads), "--device", device]
    if device == "cpu" and colocated > 1:
        words += ["--colocated", str(colocated)]
    text = shlex.join(words)
    if factory == "MODULE:WORKLOAD":
        text += f" (MODULE:WORKLOAD returns the model of {spec} with make_batch and loss_fn)"
    return text + ", then name that file as the problem's model"


def prediction_off_cause(ratio: float, model: str, same_model: bool, slowed: Sequence[Fault]) -> str:
    """Why the steady iteration time is `ratio` times the plan's prediction,
    likely: a slowing fault injected into the run (`slowed`), a trainer model
    smaller or bigger than the problem's `model` (whose profile priced the
    plan), or a host busier than when that profile was measured (the zoo
    trainer runs the very model the profile measured: `same_model`)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    cpus = os.cpu_count() or 1
    busy = f"this host is busier than when the profile of '{model}' was measured" + (
        "" if load is None else f" (load average {load:.1f} on {cpus} CPUs)")
    bigger = f"the trainer's model is bigger than the problem's model '{model}', whose profile priced the plan"
    if slowed and ratio > 1:
        return "the injected fault " + ", ".join(describe_fault(f) for f in slowed)
    if ratio < 1:
        return f"the trainer's model is smaller than the problem's model '{model}', whose profile priced the plan"
    if same_model:
        return busy
    if load is not None and load > cpus:
        return f"{busy}, or {bigger}"
    return f"{bigger}, or {busy}"
