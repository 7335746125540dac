"""The error root of thrifty, at the bottom layer so every layer can raise it.

Status is data, failure is an exception: an infeasible problem is a `Plan`
with a status, never an exception. These exceptions are for input that cannot
be used (`ProblemError`), a backend that broke (`SolverError`), a cloud that
failed (`ProviderError`) and a missing optional dependency
(`MissingDependencyError`).
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable, Iterator

__all__ = [
    "ThriftyError",
    "ProblemError",
    "SolverError",
    "ProviderError",
    "MissingDependencyError",
    "closest_names",
    "in_file",
]


class ThriftyError(Exception):
    """Root of every error thrifty raises on purpose."""


class ProblemError(ThriftyError, ValueError):
    """Bad input: a problem, profile, probe or config that cannot be used.

    `path` is the JSON path of the bad field (``instances[2].quota``) and
    `source` the file it came from, when known; the message already names both.
    """

    def __init__(self, message: str, *, path: str | None = None, source: str | None = None):
        self.path = path
        self.source = source
        prefix = ""
        if source:
            prefix += f"{source}: "
        if path:
            prefix += f"{path}: "
        super().__init__(prefix + message)
        self.message = message


@contextlib.contextmanager
def in_file(source: str) -> Iterator[None]:
    """A `ProblemError` raised inside that names no file names `source`, the file its field is in (a field
    found bad past the file's own schema: a model without a profile, a plan the problem cannot run)."""
    try:
        yield
    except ProblemError as e:
        if e.source is not None:
            raise
        raise ProblemError(e.message, path=e.path, source=source) from None


class SolverError(ThriftyError, RuntimeError):
    """A solver backend failed (not: the problem is infeasible)."""


class ProviderError(ThriftyError, RuntimeError):
    """A cloud provider failed: its machines or its storage (capacity,
    credentials, API errors)."""


class MissingDependencyError(ThriftyError, ImportError):
    """A dependency is not installed: an optional heavy one (`extra` names the
    extra that provides it), or, with `extra` None, one of every install."""

    def __init__(self, package: str, extra: str | None):
        if extra is None:  # a dependency of every install
            super().__init__(f"this needs the package '{package}', which thrifty depends on but cannot import; "
                             "reinstall thrifty")
        else:
            super().__init__(
                f"this needs the optional package '{package}', which is not installed; "
                f"install it with: pip install 'thrifty[{extra}]'"
            )
        self.package = package
        self.extra = extra


def closest_names(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to `name`, for 'did you mean' messages."""
    known = sorted(set(known))
    close = difflib.get_close_matches(name, known, n=n, cutoff=0.5)
    if not close:
        close = [k for k in known if name.lower() in k.lower() or k.lower() in name.lower()][:n]
    return close
