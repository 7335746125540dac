"""``thrifty schema``: print the JSON Schema of a problem kind or of a data file format."""

from __future__ import annotations

import argparse
import json
from typing import Any

HELP = "print the JSON Schema of a problem file (training or tuning) or of a data file"

PROBLEM_KINDS = ("training", "tuning")
DATA_FORMATS = ("catalog", "scaling-profile", "compute-profile", "compute-model")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=PROBLEM_KINDS + DATA_FORMATS,
                        help="a problem kind, or a data file: an instance catalog (thrifty.catalog/1), a scaling "
                             "profile, a compute profile or a fitted compute model")


def data_file_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of a data file format, from the model of the layer that reads it."""
    from thrifty.datasets.catalog import CatalogFile
    from thrifty.perfmodels.compute import ComputeModelFile
    from thrifty.perfmodels.profile import ComputeProfile
    from thrifty.perfmodels.scaling import ScalingProfileFile

    models = dict(zip(DATA_FORMATS, (CatalogFile, ScalingProfileFile, ComputeProfile, ComputeModelFile)))
    return models[kind].model_json_schema()


def run(args: argparse.Namespace) -> int:
    from thrifty.solver.problem import problem_json_schema

    schema = problem_json_schema(args.kind) if args.kind in PROBLEM_KINDS else data_file_schema(args.kind)
    print(json.dumps(schema, indent=1))
    return 0
