"""Argument types shared by the commands: argparse reports their errors as
usage errors (exit 2) with the rule that was broken."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["int_at_least", "positive_float", "non_negative_float", "output_file", "output_folder", "metrics_kinds",
           "EXIT_CODES",
           "COMMON_EXIT_CODES", "exit_codes_epilog", "with_exit_codes"]

# The one table of exit codes of every thrifty command (the README's "Command-line conventions"); a command's
# --help lists the ones it can return, each with this meaning and what it means for that command.
EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "a failure",
    2: "bad input",
    3: "infeasible",
    4: "finished outside its limits or goal",
    130: "interrupted (SIGINT, Ctrl-C)",
    141: "the reader of the output went away (thrifty ... | head)",
    143: "terminated (SIGTERM)",
}


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


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number")
    return value


def positive_float(text: str) -> float:
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be a positive number")
    return value


def non_negative_float(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be zero or a positive number")
    return value


def _probe(text: str, look: Callable[[], bool]) -> bool:
    """`look()` at the file system for `text`, its failures as usage errors (a NUL byte, a name too long, a
    folder we may not enter)."""
    try:
        return look()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name: it contains a NUL byte") from None
    except OSError as e:
        raise argparse.ArgumentTypeError(f"'{text}' cannot be written: {e.strerror or e}") from None


def _writable_from(folder: Path, text: str) -> None:
    """The first folder of `folder` and its parents that exists must be a folder we can write in (the rest is
    made on writing)."""
    while not _probe(text, folder.exists):
        folder = folder.parent
    if not _probe(text, folder.is_dir):
        raise argparse.ArgumentTypeError(f"'{text}' cannot be written: '{folder}' is a file, not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"'{text}' cannot be written: no permission to write in '{folder}'")


def metrics_kinds(text: str) -> tuple[str, ...]:
    """``--metrics``: the optional metrics sinks named, comma-separated (`thrifty.runtime.metrics.parse_kinds`)."""
    from thrifty.core.errors import ProblemError
    from thrifty.runtime.metrics import parse_kinds

    try:
        return parse_kinds(text)
    except ProblemError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def output_file(text: str) -> str:
    """A file a command will write, checked before the command does any work (so that nothing is computed, or
    half written, for an output that cannot be): not a folder, under a folder that exists or can be made, in
    which we may write."""
    if not text or text.endswith(("/", os.sep)):
        raise argparse.ArgumentTypeError(f"'{text}' names a folder; give a file name")
    path = Path(text)
    if _probe(text, path.is_dir):
        raise argparse.ArgumentTypeError(f"'{text}' is a folder; give a file name")
    _writable_from(path.parent, text)
    return text


def output_folder(text: str) -> str:
    """A folder a command will write its results in: not an existing file, creatable and writable (as
    `output_file`)."""
    if not text:
        raise argparse.ArgumentTypeError("the folder name is empty")
    path = Path(text)
    if _probe(text, lambda: path.exists() and not path.is_dir()):
        raise argparse.ArgumentTypeError(f"'{text}' is a file, not a folder")
    _writable_from(path, text)
    return text


def exit_codes_epilog(codes: Mapping[int, str]) -> str:
    """The epilogue of a command's --help: each exit code in `codes` with its meaning in `EXIT_CODES`, then
    what it means for this command (`codes[code]`, may be empty). A code outside the table is a bug."""
    unknown = sorted(set(codes) - set(EXIT_CODES))
    if unknown:
        raise ValueError(f"exit codes {unknown} are not in the table of exit codes {sorted(EXIT_CODES)}")
    lines = ["exit codes:"]
    for code in sorted(codes):
        detail = codes[code]
        lines.append(f"  {code:<4} {EXIT_CODES[code]}" + (f": {detail}" if detail else ""))
    return "\n".join(lines)


# what every command can return, whatever it does (thrifty.runtime.cli.main)
COMMON_EXIT_CODES: dict[int, str] = {2: "a usage error, or a bad file or field", 130: "", 141: ""}


def with_exit_codes(parser: argparse.ArgumentParser, codes: Mapping[int, str], after: str = "") -> None:
    """Show `codes` and `COMMON_EXIT_CODES` in `parser`'s --help, laid out as
    written, then the paragraph `after` (if any)."""
    parser.epilog = exit_codes_epilog({**COMMON_EXIT_CODES, **codes}) + (f"\n\n{after}" if after else "")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
