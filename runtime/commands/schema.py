"""``thrifty schema``: print the JSON Schema of a problem file, a plan file or a data file.

``training`` and ``tuning`` are the two problem kinds; ``experiment`` is a
tuning experiment (what ``thrifty tune`` reads); ``plan`` is a training
plan (what ``thrifty solve --out`` writes for a training problem and
``thrifty run`` reads) and ``tuning-plan`` a tuning plan (what the plan
executor reads). The data files are an instance catalog, a scaling profile, a
compute profile, a fitted compute model, a learned allreduce model (what
``thrifty fit-allreduce`` writes) and a row of allreduce probes (``probe-rows``:
one row of the CSV that ``thrifty probe-allreduce`` writes and ``thrifty
fit-allreduce`` reads, its columns in file order; in the CSV every cell is
text, read as its column's type) and the derived cloud allreduce model
(``cloud-allreduce-model``, ``datasets/allreduce/cloud-derived-model.json``).
Each schema is its pydantic model's, owned by the layer that reads the file,
so it accepts exactly what thrifty accepts.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any
from thrifty.runtime.commands._args import with_exit_codes

if TYPE_CHECKING:
    from pydantic import BaseModel

HELP = "print the JSON Schema of a problem file (training, tuning), a plan file (plan, tuning-plan) or a data file"

PROBLEM_KINDS = ("training", "tuning")
PLAN_KINDS = ("plan", "tuning-plan")
EXPERIMENT_KINDS = ("experiment",)
DATA_FORMATS = ("catalog", "scaling-profile", "compute-profile", "compute-model", "allreduce-model",
                "probe-rows", "cloud-allreduce-model")
KINDS = PROBLEM_KINDS + EXPERIMENT_KINDS + PLAN_KINDS + DATA_FORMATS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    with_exit_codes(parser, {0: ""})
    parser.add_argument("kind", choices=KINDS,
                        help="training or tuning: a problem file; experiment: a tuning experiment (thrifty tune); "
                             "plan: a training plan; tuning-plan: a tuning plan; "
                             "or a data file: an instance catalog (thrifty.catalog/1), a scaling profile, a compute "
                             "profile, a fitted compute model, a learned allreduce model, one row of a probe CSV "
                             "or the derived cloud allreduce model")


def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of one of `KINDS`, from the model of the layer that reads it."""
    if kind in PROBLEM_KINDS:
        from thrifty.solver.problem import problem_json_schema

        return problem_json_schema(kind)
    if kind in EXPERIMENT_KINDS:
        from thrifty.runtime.tuning.experiment_file import experiment_json_schema

        return experiment_json_schema()
    if kind in PLAN_KINDS:
        from thrifty.solver.plan import Plan
        from thrifty.solver.tuning_plan import TuningPlan

        return (Plan if kind == "plan" else TuningPlan).model_json_schema()
    from thrifty.datasets.catalog import CatalogFile
    from thrifty.perfmodels.allreduce.derived import CloudAllreduceModelFile
    from thrifty.perfmodels.allreduce.model import AllreduceModelFile
    from thrifty.perfmodels.allreduce.table import ProbeRow
    from thrifty.perfmodels.compute import ComputeModelFile
    from thrifty.perfmodels.profile import ComputeProfile
    from thrifty.perfmodels.scaling import ScalingProfileFile

    models: dict[str, type[BaseModel]] = dict(zip(DATA_FORMATS, (
        CatalogFile, ScalingProfileFile, ComputeProfile, ComputeModelFile, AllreduceModelFile, ProbeRow,
        CloudAllreduceModelFile)))
    return models[kind].model_json_schema()


def run(args: argparse.Namespace) -> int:
    print(json.dumps(schema(args.kind), indent=1))
    return 0
