"""Where runs live: ``./thrifty-runs/`` holds the folders of ``thrifty run``
and ``thrifty tune`` alike, and ``--resume`` without a folder goes on with the
one of its command that was active last."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["RUNS_FOLDER", "newest_run"]

RUNS_FOLDER = "thrifty-runs"


def newest_run(root: str | Path, marker: str, activity: Sequence[str]) -> Path | None:
    """The folder under `root` holding `marker` (the file that says which command's run it is) whose
    `activity` files (`marker` among them or not) changed last, ties to the later name; None when there is
    none."""
    root = Path(root)
    runs = [d for d in root.iterdir() if (d / marker).is_file()] if root.is_dir() else []

    def last_active(folder: Path) -> float:
        return max((folder / name).stat().st_mtime for name in (marker, *activity) if (folder / name).exists())

    return max(runs, key=lambda d: (last_active(d), d.name), default=None)
