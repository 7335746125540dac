"""Argument types shared by the commands: argparse reports their errors as
usage errors (exit 2) with the rule that was broken."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["int_at_least", "positive_float"]


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer type that must be at least `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        return value

    return parse


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value
