"""Find compute models by (model, device) among the shipped profiles or files.

Shipped profiles live in ``datasets/profiles/{measured,derived}/`` named
``<model>__<device>.json``; a measured profile wins over a derived one for the
same key. A user can add profile files or folders; a name that no profile
answers is an error listing what is available.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from thrifty.core.errors import ProblemError, closest_names
from thrifty.datasets.paths import profile_files
from thrifty.perfmodels.compute import ComputeModel, load_compute_model

__all__ = ["ModelLibrary", "shipped_library"]


def _key_of(path: Path) -> tuple[str, str] | None:
    stem = path.stem
    if "__" not in stem:
        return None
    model, device = stem.rsplit("__", 1)
    return model, device


class ModelLibrary:
    """Compute models by (model, device), loaded lazily and cached."""

    def __init__(self, paths: list[Path] | None = None):
        self._paths: dict[tuple[str, str], Path] = {}
        self._models: dict[tuple[str, str], ComputeModel] = {}
        for p in paths if paths is not None else profile_files():
            key = _key_of(p)
            if key is not None and key not in self._paths:
                self._paths[key] = p

    def add(self, model: ComputeModel) -> None:
        """Add (or override) a compute model, e.g. one loaded from a user's file."""
        self._models[(model.model, model.device)] = model

    def add_file(self, path: str | Path) -> ComputeModel:
        model = load_compute_model(path)
        self.add(model)
        return model

    def keys(self) -> list[tuple[str, str]]:
        return sorted(set(self._paths) | set(self._models))

    def models(self) -> list[str]:
        return sorted({m for m, _ in self.keys()})

    def devices(self, model: str) -> list[str]:
        return sorted({d for m, d in self.keys() if m == model})

    def get(self, model: str, device: str) -> ComputeModel:
        key = (model, device)
        if key in self._models:
            return self._models[key]
        if key not in self._paths:
            raise self._missing(model, device)
        loaded = load_compute_model(self._paths[key])
        if (loaded.model, loaded.device) != key:
            raise ProblemError(
                f"file name says model '{model}' on device '{device}' but the profile is "
                f"'{loaded.model}' on '{loaded.device}'",
                source=str(self._paths[key]),
            )
        self._models[key] = loaded
        return loaded

    def _missing(self, model: str, device: str) -> ProblemError:
        if model not in self.models():
            close = closest_names(model, self.models())
            hint = f"; closest: {', '.join(close)}" if close else ""
            return ProblemError(
                f"no compute profile for model '{model}'{hint}; available models: "
                f"{', '.join(self.models()) or '(none)'}"
            )
        return ProblemError(
            f"no compute profile for model '{model}' on device '{device}'; "
            f"'{model}' has profiles for: {', '.join(self.devices(model))}"
        )


@lru_cache(maxsize=1)
def shipped_library() -> ModelLibrary:
    """The library of profiles shipped in thrifty.datasets (cached)."""
    return ModelLibrary()
