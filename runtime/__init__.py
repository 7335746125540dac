"""thrifty.runtime: the command line, executors, schedulers and providers.

``thrifty.runtime.train(plan, trainer, ...)`` runs a training plan (see
`thrifty.runtime.training.driver.train`). It is loaded on first use, so that
importing the command line (``thrifty solve``) loads no torch.
"""

from typing import Any

__all__ = ["train"]


def __getattr__(name: str) -> Any:
    if name == "train":
        from thrifty.runtime.training.driver import train

        return train
    raise AttributeError(f"module 'thrifty.runtime' has no attribute {name!r}")
