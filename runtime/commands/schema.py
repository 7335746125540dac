"""``thrifty schema``: print the JSON Schema of a problem kind."""

from __future__ import annotations

import argparse
import json

HELP = "print the JSON Schema of a problem file (training or tuning)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=("training", "tuning"), help="the problem kind")


def run(args: argparse.Namespace) -> int:
    from thrifty.solver.problem import problem_json_schema

    print(json.dumps(problem_json_schema(args.kind), indent=1))
    return 0
