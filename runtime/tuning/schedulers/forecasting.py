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

The metric's range: the project's forecaster defaults to ``[0, 1]``
(accuracy) and warps the curve by its headroom to the upper bound. A
scheduler whose metric has another range (a loss, as POP sees it, is a
negative score bounded above by 0; a reward may be open on both sides) says
so with ``metric_range`` (``None`` for an open side), and the forecaster is
then called with ``lower=`` and ``upper=``; with the default range it is
called without them, so a forecaster written for accuracy needs neither.
A reported value outside the range is bad input (`check_in_range`): the
forecaster cannot use it, and the message says which setting to change.

`Memoized` caches forecasts by the observed curve (and the prior): a trial's curve prefix is
the same in every replay of a trace, so trace-driven sensitivity runs over
many configuration orders (HyperDrive 7.2.2) predict each prefix once, the way
HyperDrive's node agents compute a prediction once per evaluation boundary
(5.2). It also accounts the time spent predicting.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from thrifty.core.errors import ProblemError

__all__ = ["CurveForecast", "Forecaster", "default_forecaster", "forecast_trial", "Memoized", "MetricRange",
           "DEFAULT_RANGE", "check_metric_range", "check_in_range", "in_range", "range_keywords", "range_or_default",
           "score_range", "shown_range"]

MetricRange = tuple[float | None, float | None]
DEFAULT_RANGE: MetricRange = (0.0, 1.0)


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


def check_metric_range(metric_range: Any, path: str = "metric_range") -> MetricRange:
    """`metric_range` as (lower, upper): two entries, each a finite number or
    None (an open side), lower below upper."""
    if not isinstance(metric_range, (tuple, list)) or len(metric_range) != 2:
        raise ProblemError(f"`{path}` is {metric_range!r}, but must be [lower, upper] (null for an open side)",
                           path=path)
    for i, side in enumerate(metric_range):
        if side is not None and (isinstance(side, bool) or not isinstance(side, (int, float))
                                 or not math.isfinite(side)):
            raise ProblemError(f"`{path}[{i}]` is {side!r}, but must be a finite number or null", path=f"{path}[{i}]")
    lower, upper = (None if v is None else float(v) for v in metric_range)
    if lower is not None and upper is not None and lower >= upper:
        raise ProblemError(f"`{path}` is [{lower:g}, {upper:g}], but its lower side must be below its upper side",
                           path=path)
    return lower, upper


def in_range(value: float, metric_range: Sequence[float | None]) -> bool:
    lower, upper = metric_range
    return (lower is None or value >= lower) and (upper is None or value <= upper)


def shown_range(metric_range: Sequence[float | None]) -> str:
    return "[" + ", ".join("null" if v is None else f"{v:g}" for v in metric_range) + "]"


def check_in_range(trial: Any, values: Sequence[float], metric_range: MetricRange, who: str,
                   first: int = 1) -> None:
    """A ProblemError naming the first of `values` (the trial's scores from
    its iteration `first` on) outside `metric_range`."""
    outside = next((i for i, v in enumerate(values) if not in_range(v, metric_range)), None)
    if outside is not None:
        raise ProblemError(
            f"trial {trial.trial_id} reported {values[outside]:g} (as {who} sees the metric, higher is better) at "
            f"iteration {first + outside}, outside the metric's range {shown_range(metric_range)} that {who} forecasts "
            "within; give the metric's range as metric_range ([lower, upper] in the metric's own units, null for "
            "an open side)",
            path="metric_range")


def range_or_default(metric_range: Any, mode: str) -> Any:
    """`metric_range`, or when None the default of `mode`: [0, 1] for
    ``max`` (an accuracy), [0, open] for ``min`` (a loss)."""
    if metric_range is not None:
        return metric_range
    return DEFAULT_RANGE if mode == "max" else (0.0, None)


def score_range(metric_range: Any, mode: str) -> MetricRange:
    """A metric's range in its own units (None: the default of `mode`,
    `range_or_default`), checked, as the schedulers see the metric: higher is
    better, so ``min`` negates it."""
    lower, upper = check_metric_range(range_or_default(metric_range, mode))
    if mode == "max":
        return lower, upper
    return (None if upper is None else -upper), (None if lower is None else -lower)


def range_keywords(metric_range: MetricRange) -> dict[str, float | None]:
    """The forecaster's ``lower``/``upper`` keywords: none for the default range."""
    if tuple(metric_range) == DEFAULT_RANGE:
        return {}
    return {"lower": metric_range[0], "upper": metric_range[1]}


def forecast_trial(forecaster: Forecaster, trial: Any, trials: Any, max_epoch: int,
                   learn_prior: bool, metric_range: MetricRange = DEFAULT_RANGE) -> CurveForecast:
    """The forecast of `trial`'s metric curve (epochs 1..n) within
    `metric_range`; with `learn_prior`, under the `TrialPrior` of the other
    `trials` (a mapping id -> trial) that were observed longer than n epochs.
    A forecaster that takes no ``prior`` is called without one until the
    prior has learned something."""
    n = trial.iteration
    metrics = list(trial.metrics)
    bounds = range_keywords(metric_range)
    if not learn_prior:
        return forecaster(list(range(1, n + 1)), metrics, max_epoch, seed=0, **bounds)
    from thrifty.perfmodels.learning_curve import TrialPrior

    t0 = time.perf_counter()
    longer = [t.metrics for tid, t in trials.items() if tid != trial.trial_id and len(t.metrics) > n]
    learned = TrialPrior.of(longer, max_epoch, lower=metric_range[0], upper=metric_range[1])
    prior = learned.for_curve(metrics)
    if isinstance(forecaster, Memoized):  # learning the prior is prediction time too
        forecaster.seconds += time.perf_counter() - t0
    if prior is learned.base:  # too few longer trials yet: the forecaster's own default
        return forecaster(list(range(1, n + 1)), metrics, max_epoch, seed=0, **bounds)
    return forecaster(list(range(1, n + 1)), metrics, max_epoch, seed=0, prior=prior, **bounds)


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
                 seed: int | None = 0, prior: Any = None, **bounds: Any) -> CurveForecast:
        key = (tuple(epochs), tuple(values), max_epoch, seed, prior, tuple(sorted(bounds.items())))
        self.calls += 1
        found = self._cache.get(key)
        if found is None:
            self.misses += 1
            t0 = time.perf_counter()
            more = bounds if prior is None else {"prior": prior, **bounds}
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
