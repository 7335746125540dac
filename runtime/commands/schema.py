"""``thrifty schema``: print the JSON Schema of a problem file or of a plan file.

``training`` and ``tuning`` are the two problem kinds; ``plan`` is a training
plan (what ``thrifty solve --out`` writes for a training problem and
``thrifty run`` reads) and ``tuning-plan`` a tuning plan (what the plan
executor reads). Each schema is its pydantic model's, so it accepts exactly
what thrifty accepts.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

HELP = "print the JSON Schema of a problem file (training, tuning) or a plan file (plan, tuning-plan)"

KINDS = ("training", "tuning", "plan", "tuning-plan")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=KINDS, help="training or tuning: a problem file; plan: a training plan; "
                                                    "tuning-plan: a tuning plan")


def schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of one of `KINDS`."""
    if kind == "plan":
        from thrifty.solver.plan import Plan

        return Plan.model_json_schema()
    if kind == "tuning-plan":
        from thrifty.solver.tuning_plan import TuningPlan

        return TuningPlan.model_json_schema()
    from thrifty.solver.problem import problem_json_schema

    return problem_json_schema(kind)


def run(args: argparse.Namespace) -> int:
    print(json.dumps(schema(args.kind), indent=1))
    return 0
