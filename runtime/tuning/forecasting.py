"""How POP and EarlyTerm reach the learning-curve predictor.

A *forecaster* is any callable with the signature of
``thrifty.perfmodels.learning_curve.forecast(epochs, values, max_epoch, *, seed)``
returning an object with ``prob_at_least(y, epoch)`` (HyperDrive 3.1.1, Eq. 1:
``P(y(m) >= y | y(1..n))``) and optionally ``prob_reached_by(y, first,
last)`` (the first-passage probabilities of the observed metric, which POP
prefers). Schedulers take one as a constructor parameter
and default to the real predictor, imported only when first needed (so that
tests can inject a small fake one and nothing heavy loads at import time).

`forecast_trial` is how a scheduler asks about one trial: with
``learn_prior`` it passes the forecaster a prior learned from the
experiment's trials that ran longer than this one
(`thrifty.perfmodels.learning_curve.TrialPrior`), renewed at every call, so
that it follows the trials as they run and finish.

`Memoized` caches forecasts by the observed curve (and the prior): a trial's curve prefix is
the same in every replay of a trace, so trace-driven sensitivity runs over
many configuration orders (HyperDrive 7.2.2) predict each prefix once, the way
HyperDrive's node agents compute a prediction once per evaluation boundary
(5.2). It also accounts the time spent predicting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

__all__ = ["CurveForecast", "Forecaster", "default_forecaster", "forecast_trial", "Memoized"]


class CurveForecast(Protocol):
    def prob_at_least(self, y: float, epoch: int) -> float: ...


class _FirstPassageForecast(CurveForecast, Protocol):
    """A forecast with the optional ``prob_reached_by`` (module docstring)."""

    def prob_reached_by(self, y: float, first_epoch: int, last_epoch: int) -> Any: ...


Forecaster = Callable[..., CurveForecast]


def default_forecaster() -> Forecaster:
    """The project's learning-curve predictor (perfmodels.learning_curve.forecast)."""
    from thrifty.perfmodels.learning_curve import forecast

    return forecast


def forecast_trial(forecaster: Forecaster, trial: Any, trials: Any, max_epoch: int,
                   learn_prior: bool) -> CurveForecast:
    """The forecast of `trial`'s metric curve (epochs 1..n); with `learn_prior`,
    under the `TrialPrior` of the other `trials` (a mapping id -> trial) that
    were observed longer than n epochs. A forecaster that takes no ``prior``
    is called without one until the prior has learned something."""
    n = trial.iteration
    metrics = list(trial.metrics)
    if not learn_prior:
        return forecaster(list(range(1, n + 1)), metrics, max_epoch, seed=0)
    from thrifty.perfmodels.learning_curve import TrialPrior

    t0 = time.perf_counter()
    longer = [t.metrics for tid, t in trials.items() if tid != trial.trial_id and len(t.metrics) > n]
    learned = TrialPrior.of(longer, max_epoch)
    prior = learned.for_curve(metrics)
    if isinstance(forecaster, Memoized):  # learning the prior is prediction time too
        forecaster.seconds += time.perf_counter() - t0
    if prior is learned.base:  # too few longer trials yet: the forecaster's own default
        return forecaster(list(range(1, n + 1)), metrics, max_epoch, seed=0)
    return forecaster(list(range(1, n + 1)), metrics, max_epoch, seed=0, prior=prior)


class Memoized:
    """A forecaster that remembers its forecasts per (curve, max_epoch) and their answers per
    (y, epoch), and accounts the time spent predicting (`seconds`)."""

    def __init__(self, forecaster: Forecaster):
        self._forecaster = forecaster
        self._cache: dict[tuple[Any, ...], _RememberedForecast] = {}
        self.calls = 0
        self.misses = 0
        self.seconds = 0.0

    def __call__(self, epochs: Sequence[int], values: Sequence[float], max_epoch: int, *,
                 seed: int | None = 0, prior: Any = None) -> CurveForecast:
        key = (tuple(epochs), tuple(values), max_epoch, seed, prior)
        self.calls += 1
        found = self._cache.get(key)
        if found is None:
            self.misses += 1
            t0 = time.perf_counter()
            more = {} if prior is None else {"prior": prior}
            found = _RememberedForecast(self._forecaster(epochs, values, max_epoch, seed=seed, **more), self)
            self.seconds += time.perf_counter() - t0
            self._cache[key] = found
        return found


class _RememberedForecast:
    def __init__(self, forecast: CurveForecast, owner: Memoized):
        self._forecast = forecast
        self._owner = owner
        self._answers: dict[tuple[float, int], float] = {}
        self._reached: dict[tuple[float, int], Any] = {}
        if hasattr(forecast, "prob_reached_by"):  # offered only when the forecast has it
            self.prob_reached_by = self._prob_reached_by

    def _prob_reached_by(self, y: float, first_epoch: int, last_epoch: int) -> Any:
        # answered once up to the last epoch the forecast covers; later windows are prefixes
        key = (y, first_epoch)
        answer = self._reached.get(key)
        if answer is None or len(answer) < last_epoch - first_epoch + 1:
            t0 = time.perf_counter()
            top = max(int(getattr(self._forecast, "max_epoch", last_epoch)), last_epoch)
            forecast = cast(_FirstPassageForecast, self._forecast)  # __init__ offers this only then
            answer = self._reached[key] = forecast.prob_reached_by(y, first_epoch, top)
            self._owner.seconds += time.perf_counter() - t0
        return answer[: last_epoch - first_epoch + 1]

    def prob_at_least(self, y: float, epoch: int) -> float:
        key = (y, epoch)
        answer = self._answers.get(key)
        if answer is None:
            t0 = time.perf_counter()
            answer = self._answers[key] = self._forecast.prob_at_least(y, epoch)
            self._owner.seconds += time.perf_counter() - t0
        return answer
