"""The learning-curve predictor (thrifty.perfmodels.learning_curve) and the
measured learning-curve traces (thrifty.datasets.curves)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from thrifty.datasets import curves as curves_module
from thrifty.datasets.curves import Trace, load_traces
from thrifty.core.errors import ProblemError
from thrifty.perfmodels.learning_curve import MIN_REFERENCES, CurvePrior, TrialPrior, forecast

HORIZON = 50


def _pow3(x):
    return 0.92 - 0.55 * x**-0.9


def _weibull(x):
    return 0.88 - 0.7 * np.exp(-((x / 6.0) ** 1.5))


def _mmf(x):
    return 0.95 - 0.8 / (1.0 + (x / 4.0) ** 2.0)


def _coverage(curve, seen_epochs: int, seeds: int, prior: CurvePrior | None = None):
    """Noisy curves from `curve` (sd 0.01), `seen_epochs` of 50 seen: the hit
    rate of the central 90% interval for the noisy value at epoch 50, the
    median interval width and the mean absolute error of the predictive mean."""
    hits, widths, errors = [], [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        x = np.arange(1, seen_epochs + 1)
        seen = np.clip(curve(x) + rng.normal(0, 0.01, x.size), 0, 1)
        final = float(curve(np.array([HORIZON]))[0] + rng.normal(0, 0.01))
        dist = forecast(x, seen, HORIZON, seed=seed, prior=prior)
        lo, hi = dist.quantile(0.05, HORIZON), dist.quantile(0.95, HORIZON)
        hits.append(lo <= final <= hi)
        widths.append(hi - lo)
        errors.append(abs(dist.mean(HORIZON) - final))
    return float(np.mean(hits)), float(np.median(widths)), float(np.mean(errors))


def test_without_discrepancy_the_interval_covers_at_the_stated_rate():
    """Data from a family in the ensemble with independent noise is exactly the
    model once the discrepancy is switched off: 90% intervals cover about 90%."""
    no_discrepancy = CurvePrior(discrepancy=1e-4)
    results = [_coverage(curve, n, 50, no_discrepancy) for curve in (_pow3, _mmf) for n in (5, 15)]
    assert 0.82 <= np.mean([hit for hit, _, _ in results]) <= 0.97
    assert all(width < 0.4 for _, width, _ in results)


@pytest.mark.parametrize("curve", [_pow3, _weibull, _mmf], ids=["pow3", "weibull", "mmf"])
def test_default_extrapolation_is_calibrated_and_useful(curve):
    """With the default settings (sized on real curves, in log headroom, where
    a curve at epoch 15 of 50 may still change its headroom two- or
    threefold) the model is at least as wide as needed on clean family curves,
    and still bounded and close."""
    hit, width, error = _coverage(curve, 15, 20)
    assert hit >= 0.85
    assert width < 0.35
    assert error < 0.07


def test_probabilities_are_monotone_in_y_and_match_quantiles():
    x = np.arange(1, 9)
    dist = forecast(x, _pow3(x), HORIZON)
    ys = np.linspace(-0.1, 1.1, 121)
    probs = np.array([dist.prob_at_least(y, HORIZON) for y in ys])
    assert np.all(np.diff(probs) <= 1e-12)
    assert probs[0] == pytest.approx(1.0) and probs[-1] == pytest.approx(0.0, abs=1e-12)
    for q in (0.05, 0.5, 0.95):
        assert dist.prob_at_least(dist.quantile(q, HORIZON), HORIZON) == pytest.approx(1 - q, abs=1e-3)
    assert dist.quantile(0.05, HORIZON) < dist.mean(HORIZON) < dist.quantile(0.95, HORIZON)


def test_uncertainty_grows_with_the_horizon_and_shrinks_with_data():
    x = np.arange(1, 31)
    y = _weibull(x)
    few, many = forecast(x[:5], y[:5], HORIZON), forecast(x, y, HORIZON)

    def width(d, epoch):
        return d.quantile(0.95, epoch) - d.quantile(0.05, epoch)

    assert width(few, 10) < width(few, HORIZON)
    assert width(many, HORIZON) < width(few, HORIZON)


def test_one_or_two_points_give_a_wide_honest_answer():
    for n in (1, 2):
        dist = forecast(np.arange(1, n + 1), [0.2, 0.35][:n], HORIZON)
        lo, hi = dist.quantile(0.05, HORIZON), dist.quantile(0.95, HORIZON)
        assert 0.0 <= lo < 0.4 and hi > 0.7 and hi <= 1.0


def test_answers_stay_inside_the_bounds_and_are_reproducible():
    x = np.arange(1, 11)
    diverged = np.array([0.6, 0.4, 0.2, 0.1, 0.1, 0.098, 0.1, 0.1, 0.1, 0.1])
    a, b = forecast(x, diverged, HORIZON, seed=3), forecast(x, diverged, HORIZON, seed=3)
    assert a.mean(HORIZON) == b.mean(HORIZON)
    assert 0.0 <= a.quantile(0.01, HORIZON) <= a.quantile(0.99, HORIZON) <= 1.0
    assert sum(a.family_weights.values()) == pytest.approx(1.0)


def test_unbounded_metric():
    x = np.arange(1, 11)
    loss = -(2.0 + 3.0 * x**-0.5)  # negative loss: higher is better, not in [0, 1]
    dist = forecast(x, loss, 40, lower=None, upper=None)
    assert dist.quantile(0.05, 40) < dist.mean(40) < dist.quantile(0.95, 40)
    assert loss[-1] - 0.5 < dist.mean(40) < -2.0 + 0.5


@pytest.mark.parametrize(
    "epochs, values, max_epoch, message",
    [
        ([], [], 10, "empty"),
        ([1, 2], [0.1, float("nan")], 10, "NaN"),
        ([1, 2, 3], [0.1, 0.2], 10, "match"),
        ([1, 3, 2], [0.1, 0.2, 0.3], 10, "increasing"),
        ([0, 1], [0.1, 0.2], 10, "positive"),
        ([1, 2, 3], [0.1, 0.2, 0.3], 2, "max_epoch"),
        ([1, 2], [0.1, 1.2], 10, "upper"),
        ([1, 2], [-0.1, 0.2], 10, "lower"),
        ([1, 2], [0.1, 0.2], float("inf"), "max_epoch"),
    ],
)
def test_bad_curves_are_rejected(epochs, values, max_epoch, message):
    with pytest.raises(ValueError, match=message):
        forecast(epochs, values, max_epoch)


def test_bad_queries_are_rejected():
    dist = forecast([1, 2, 3], [0.2, 0.3, 0.35], 20)
    with pytest.raises(ValueError, match="epoch"):
        dist.prob_at_least(0.5, 21)
    with pytest.raises(ValueError, match="epoch"):
        dist.mean(0)
    with pytest.raises(ValueError, match="q"):
        dist.quantile(1.0, 10)
    with pytest.raises(ValueError, match="y"):
        dist.prob_at_least(float("nan"), 10)


@pytest.mark.parametrize(
    "field, value", [("discrepancy", 0.0), ("time_scale", "weekly"), ("samples", 3), ("noise_min", -1.0),
                     ("warp", "logit"), ("asymptote", (1.0, 0.0)), ("asymptote", (float("nan"), 1.0))]
)
def test_bad_prior_settings_are_rejected(field, value):
    with pytest.raises(ValueError, match=field):
        CurvePrior(**{field: value})


def test_shipped_traces_are_consistent():
    traces = load_traces()
    assert len(traces) >= 100
    epochs = {t.epochs for t in traces}
    assert len(epochs) == 1 and epochs.pop() >= 30
    for t in traces:
        assert isinstance(t, Trace)
        assert t.accuracy.shape == t.epoch_s.shape
        assert np.all((t.accuracy >= 0) & (t.accuracy <= 1)) and np.all(t.epoch_s > 0)
        assert {"optimizer", "learning_rate", "width", "depth", "weight_decay", "batch_size"} <= set(t.config)
    finals = np.array([t.accuracy[-1] for t in traces])
    assert finals.max() > 0.9 and finals.min() < 0.5  # real spread: good and bad configurations
    traces[0].config["width"] = -1  # callers get their own copies
    assert load_traces()[0].config["width"] != -1


def test_unknown_trace_name_suggests_the_known_one():
    with pytest.raises(ProblemError, match="digits-mlp"):
        load_traces("digits-mpl")


def test_malformed_trace_file_names_the_field(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({
        "format": "thrifty.curve_traces/1",
        "traces": [{"config": {}, "accuracy": [0.1, 0.2], "epoch_s": [0.1]}],
    }))
    monkeypatch.setattr(curves_module, "curve_trace_files", lambda: {"bad": bad})
    with pytest.raises(ProblemError, match=r"traces\[0\]\.epoch_s"):
        load_traces("bad")


def test_first_passage_grows_with_the_window_and_starts_at_the_single_epoch_chance():
    # a noisy plateau at 0.80 (noise sd 5% of the headroom, 0.01 there): with the level and noise
    # estimated from 20 epochs, a third to a half of single epochs show 0.81 or more, so some epoch
    # of the next 30 almost surely does
    rng = np.random.default_rng(3)
    x = np.arange(1, 21)
    level = 0.80 - 0.3 * np.exp(-x / 2.0)
    seen = np.clip(level + rng.normal(0, 0.05 * (1.0 - level), x.size), 0, 1)
    dist = forecast(x, seen, HORIZON, seed=0, prior=CurvePrior(discrepancy=1e-4))
    reach = dist.prob_reached_by(0.81, 21, 50)
    singles = np.array([dist.prob_at_least(0.81, e) for e in range(21, 51)])
    assert reach.shape == (30,)
    assert np.all(np.diff(reach) >= -1e-12)
    assert reach[0] == pytest.approx(singles[0], abs=0.02)
    assert singles.max() < 0.5 and reach[-1] > 0.95
    # with the default discrepancy the walk is correlated: still above every single epoch's chance
    loose = forecast(x, seen, HORIZON, seed=0)
    reach = loose.prob_reached_by(0.815, 21, 50)
    singles = np.array([loose.prob_at_least(0.815, e) for e in range(21, 51)])
    assert np.all(reach >= singles - 0.02) and reach[-1] > singles.max() + 0.1
    np.testing.assert_array_equal(reach, loose.prob_reached_by(0.815, 21, 50))  # a fixed seed
    with pytest.raises(ValueError, match="first <= last"):
        loose.prob_reached_by(0.815, 30, 21)


def test_the_warp_keeps_young_curves_from_piling_up_at_the_bound():
    """A young curve rising to 0.9: without the warp the wide early uncertainty,
    truncated at 1, puts much of its mass just below 1; in log headroom the
    chance of 0.995 is a small fraction of that, and the bound is never passed."""
    x = np.arange(1, 6)
    seen = np.array([0.5, 0.7, 0.8, 0.86, 0.9])
    warped = forecast(x, seen, HORIZON)
    before = CurvePrior(warp="none", time_scale="hyperbolic", discrepancy=1.3)  # the model before the warp
    plain = forecast(x, seen, HORIZON, prior=before)
    assert warped.prob_at_least(0.995, HORIZON) < 0.5 * plain.prob_at_least(0.995, HORIZON)
    assert warped.prob_reached_by(0.995, 6, HORIZON)[-1] < 0.2 * plain.prob_reached_by(0.995, 6, HORIZON)[-1]
    assert warped.prob_at_least(1.0 + 1e-9, HORIZON) == 0.0
    assert np.all(warped.prob_reached_by(1.01, 6, HORIZON) == 0.0)
    assert 0.9 <= warped.quantile(0.5, HORIZON) < warped.quantile(0.95, HORIZON) <= 1.0
    assert warped.quantile(0.05, HORIZON) < warped.mean(HORIZON) < warped.quantile(0.95, HORIZON)


def _plateau_curves(levels, epochs=HORIZON, seed=0):
    """Curves that rise from 0.1 to `level` (exponential, time constant 3 epochs) with noise sd 0.003."""
    rng = np.random.default_rng(seed)
    x = np.arange(1, epochs + 1)
    return [np.clip(lv - (lv - 0.1) * np.exp(-x / 3.0) + rng.normal(0, 0.003, x.size), 0, 1) for lv in levels]


def test_trial_prior_needs_enough_longer_trials():
    base = CurvePrior()
    few = TrialPrior.of(_plateau_curves([0.9] * (MIN_REFERENCES - 1)), HORIZON, base=base)
    assert few.for_curve([0.3, 0.5, 0.6, 0.7]) is base
    short = TrialPrior.of([c[:7] for c in _plateau_curves([0.9] * 20)], HORIZON, base=base)
    assert short.for_curve([0.3, 0.5, 0.6, 0.7]) is base  # references must reach 2n epochs


def test_trial_prior_learns_where_similar_trials_ended():
    """Longer trials whose plateau grows with their level at epoch 4: the prior's
    asymptote follows the new curve's level, and forecasts under it are
    narrower and closer to the truth than the curve alone gives."""
    rng = np.random.default_rng(1)
    levels = rng.uniform(0.85, 0.98, 40)
    learned = TrialPrior.of(_plateau_curves(levels), HORIZON)
    [truth] = _plateau_curves([0.95], seed=7)
    seen = truth[:4]
    prior = learned.for_curve(seen)
    assert prior.asymptote is not None
    mean, sd = prior.asymptote
    assert 1.0 - np.exp(-mean) == pytest.approx(0.95, abs=0.015)  # log headroom back to accuracy
    assert sd < 0.5
    alone, helped = forecast(np.arange(1, 5), seen, HORIZON), forecast(np.arange(1, 5), seen, HORIZON, prior=prior)
    width = lambda d: d.quantile(0.95, HORIZON) - d.quantile(0.05, HORIZON)  # noqa: E731
    assert width(helped) < width(alone)
    assert abs(helped.mean(HORIZON) - truth[-1]) < abs(alone.mean(HORIZON) - truth[-1])
    lower = learned.for_curve(_plateau_curves([0.87], seed=8)[0][:4])
    assert lower.asymptote[0] < mean


def test_second_trace_set_is_not_bunched_at_its_ceiling():
    traces = load_traces("noisy-digits-cnn")
    assert len(traces) >= 100 and {t.epochs for t in traces} == {50}
    for t in traces:
        assert {"optimizer", "learning_rate", "channels", "weight_decay", "batch_size"} <= set(t.config)
        assert np.all((t.accuracy >= 0) & (t.accuracy <= 1)) and np.all(t.epoch_s > 0)
    best = np.array([t.accuracy.max() for t in traces])
    assert best.max() < 0.9 and np.median(best) < 0.75  # far from the bound 1


@pytest.mark.parametrize("trace_set, coverage", [(None, 0.7), ("noisy-digits-cnn", 0.85)])
@pytest.mark.parametrize("seen", [10, 20])
def test_forecasts_of_measured_traces_beat_the_last_value_and_cover_most_finals(trace_set, coverage, seen):
    """The forecaster on real curves it was not given: every other shipped trace, `seen` of its 50 epochs
    shown, the final accuracy asked for. Its mean is closer to the final value than the last value seen
    (the plain guess a scheduler could make instead), and its central 90% interval holds the final value
    for most traces: at least 85% on the noisy-digits set, 70% on the default set, whose late jumps the
    discrepancy term under-covers (76% at this writing). About 2 CPU seconds in all."""
    traces = (load_traces(trace_set) if trace_set else load_traces())[::2]
    hits, errors, naive = [], [], []
    for i, trace in enumerate(traces):
        final = trace.accuracy[-1]
        dist = forecast(np.arange(1, seen + 1), trace.accuracy[:seen], trace.epochs, seed=i)
        hits.append(dist.quantile(0.05, trace.epochs) <= final <= dist.quantile(0.95, trace.epochs))
        errors.append(abs(dist.mean(trace.epochs) - final))
        naive.append(abs(trace.accuracy[seen - 1] - final))
    assert len(traces) >= 50
    assert np.mean(errors) < 0.95 * np.mean(naive), (np.mean(errors), np.mean(naive))
    assert np.mean(hits) >= coverage, np.mean(hits)


def test_trial_prior_learns_how_far_this_experiments_curves_stray():
    """References that follow their early trend closely teach a small
    discrepancy; references that take off late (after a flat start, which no
    family extrapolates) keep the widest scale of the grid."""
    from thrifty.perfmodels.learning_curve import DISCREPANCY_GRID

    horizon = 24
    x = np.arange(1, horizon + 1)
    rng = np.random.default_rng(2)
    smooth = [np.clip(lv - (lv - 0.2) * np.exp(-x / 3.0) + rng.normal(0, 0.002, x.size), 0, 1)
              for lv in rng.uniform(0.6, 0.8, 10)]
    late = [np.clip(np.where(x < t0, 0.2, 0.2 + 0.6 * (1 - np.exp(-(x - t0) / 2.0))) + rng.normal(0, 0.002, x.size),
                    0, 1) for t0 in rng.integers(9, 13, 10)]
    young = smooth[0][:4]
    calm = TrialPrior.of(smooth[1:], horizon).for_curve(young)
    wild = TrialPrior.of(late, horizon).for_curve(young)
    assert calm.discrepancy in DISCREPANCY_GRID and wild.discrepancy in DISCREPANCY_GRID

    def width(prior):
        fc = forecast(np.arange(1, 5), young, horizon, prior=replace(prior, asymptote=None))
        return fc.quantile(0.95, horizon) - fc.quantile(0.05, horizon)

    assert width(calm) < width(CurvePrior()) and width(calm) < width(wild)
