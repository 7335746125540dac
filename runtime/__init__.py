"""thrifty.runtime: the command line, executors, schedulers and providers.

``thrifty.runtime.train(plan, trainer, ...)`` runs a training plan (see
`thrifty.runtime.training.driver.train`); ``thrifty.runtime.tune(experiment,
...)`` runs a tuning experiment from a file or a dict (see
`thrifty.runtime.tuning.driver.tune`). Both are loaded on first use, so that
importing the command line (``thrifty solve``) loads no torch.
"""

from thrifty.core.optional import lazy_exports

__all__ = ["train", "tune"]

__getattr__, __dir__ = lazy_exports("thrifty.runtime", {"train": "training.driver", "tune": "tuning.driver"})
