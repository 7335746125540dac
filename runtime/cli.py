"""The ``thrifty`` command line.

Each command lives in its own module ``thrifty.runtime.commands.<name>`` with
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``. The
modules import heavy dependencies (torch, xgboost) inside ``run`` so that
``thrifty --help`` and ``thrifty solve`` start fast.

Exit codes: one table for every command, `thrifty.runtime.commands._args.EXIT_CODES`
(0 success, 1 a failure, 2 bad input, 3 infeasible, 4 finished outside its
limits or goal, 130 interrupted, 141 the reader of the output closed the pipe,
quietly, as Unix tools do, 143 terminated); each command's ``--help`` lists
the ones it can return. Errors print one line and no traceback unless
``--debug`` is given or ``THRIFTY_DEBUG=1`` is set: ``thrifty CMD: error:
MESSAGE`` for bad input, where an error about a file reads ``FILE: JSON.PATH:
message`` (`ProblemError`'s text), and ``thrifty CMD: failed: MESSAGE`` for a
failure.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from thrifty.core.errors import MissingDependencyError, ProblemError, ThriftyError

__all__ = ["main", "COMMANDS", "EXIT_OK", "EXIT_FAILURE", "EXIT_BAD_INPUT", "EXIT_INFEASIBLE",
           "EXIT_OUTSIDE_LIMITS", "EXIT_CLOSED_PIPE"]

EXIT_OK, EXIT_FAILURE, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3
EXIT_CLOSED_PIPE = 128 + 13  # as a Unix tool killed by SIGPIPE (`thrifty schema training | head`)
EXIT_OUTSIDE_LIMITS = 4  # thrifty run: every iteration done, but the time limit or budget was exceeded

# name -> module under thrifty.runtime.commands (order is the order of --help)
COMMANDS: dict[str, str] = {
    "solve": "solve",
    "schema": "schema",
    "simulate": "simulate",
    "validate": "validate",
    "profile": "profile",
    "profile-scaling": "profile_scaling",
    "probe-allreduce": "probe_allreduce",
    "fit-allreduce": "fit_allreduce",
    "catalog": "catalog",
    "cleanup": "cleanup",
    "run": "run",
    "tune": "tune",
    "node": "node",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("thrifty")
    except PackageNotFoundError:  # running from a source tree without install
        return "unknown"


def command_of(argv: Sequence[str]) -> str | None:
    """The command `argv` names: its first word that is not an option (the
    top-level options, ``--debug`` and ``--version``, take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """thrifty's parser. With `only` (a command's name), that command's
    arguments alone are added and every other command is its name and help
    line: a command line runs one command, and adding all thirteen commands'
    arguments costs more than parsing the one (``thrifty --help`` lists each
    by its help line either way)."""
    from thrifty.runtime.commands._args import EXIT_CODES, exit_codes_epilog

    parser = argparse.ArgumentParser(
        prog="thrifty",
        description="Plan and run deep-learning training and tuning on rented machines: "
        "the least cost that meets a deadline, or the least time that meets a budget.",
        epilog=exit_codes_epilog(dict.fromkeys(EXIT_CODES, "")) + "\n(each command's --help lists its own)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"thrifty {_version()}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"thrifty.runtime.commands.{module_name}")
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP)
        if only is None or only == name:
            module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=command_of(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    debug = args.debug or os.environ.get("THRIFTY_DEBUG", "") not in ("", "0")
    try:
        return int(args._run(args) or 0)
    except (ProblemError, MissingDependencyError) as e:
        if debug:
            raise
        print(f"thrifty {args.command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ThriftyError as e:
        if debug:
            raise
        print(f"thrifty {args.command}: failed: {e}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print(f"thrifty {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe() -> int:
    """The reader of our output went away: end quietly. Python would report
    the error again when it flushes stdout at exit, so stdout is pointed at
    the null device first (the recipe of Python's `signal` documentation)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (captured): nothing to flush
        pass
    return EXIT_CLOSED_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
