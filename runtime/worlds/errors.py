"""The one error of worker worlds."""

from __future__ import annotations

from thrifty.core.errors import ThriftyError

__all__ = ["WorldFailed"]


class WorldFailed(ThriftyError, RuntimeError):
    """A world of worker processes failed: the fork server did not start, a
    rank raised (its traceback in `details` and in its log), died, stalled
    past its timeout, or the world ended without the result it owed."""

    def __init__(self, message: str, rank: int | None = None, details: str = ""):
        super().__init__(message)
        self.rank = rank
        self.details = details
