"""thrifty.runtime: the command line, executors, schedulers and providers.

``thrifty.runtime.train(plan, trainer, ...)`` runs a training plan (see
`thrifty.runtime.training.driver.train`); ``thrifty.runtime.tune(experiment,
...)`` runs a tuning experiment from a file or a dict (see
`thrifty.runtime.tuning.driver.tune`). Both are loaded on first use, so that
importing the command line (``thrifty solve``) loads no torch.
"""

from typing import Any

__all__ = ["train", "tune"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from thrifty.runtime.training.driver import train

        return train
    if name == "tune":
        from thrifty.runtime.tuning.driver import tune

        return tune
    raise AttributeError(f"module 'thrifty.runtime' has no attribute {name!r}")
