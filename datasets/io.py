"""Small I/O helpers shared by every layer: atomic writes and JSON loading
with errors that name the file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from thrifty.datasets.errors import ProblemError

__all__ = ["atomic_write_text", "atomic_write_bytes", "read_json", "write_json"]


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one,
    never half of it: a temporary file in the same folder, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike[str]) -> Any:
    """Load a JSON file; a missing or malformed file is a `ProblemError` naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ProblemError("file not found", source=str(path)) from e
    except OSError as e:
        raise ProblemError(f"cannot read file: {e.strerror}", source=str(path)) from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ProblemError(
            f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}", source=str(path)
        ) from e
