"""Where the shipped data files live."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DATA_DIR", "profile_files", "allreduce_files", "curve_trace_files"]

DATA_DIR = Path(__file__).parent


def profile_files() -> list[Path]:
    """Every shipped compute profile (measured first, then derived)."""
    out: list[Path] = []
    for kind in ("measured", "derived"):
        out += sorted((DATA_DIR / "profiles" / kind).glob("*.json"))
    return out


def allreduce_files() -> dict[str, Path]:
    """Shipped allreduce models and probe files by name (stem)."""
    folder = DATA_DIR / "allreduce"
    return {p.name: p for p in sorted(folder.glob("*")) if p.suffix in (".json", ".csv")}


def curve_trace_files() -> dict[str, Path]:
    """Shipped learning-curve trace files by name (stem)."""
    return {p.stem: p for p in sorted((DATA_DIR / "curve_traces").glob("*.json"))}
