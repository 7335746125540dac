"""Calibration, accuracy and speed of the learning-curve predictor (issues 6, 19).

On the measured traces (``thrifty.datasets.curves``: digits-mlp and
noisy-digits-cnn, two kinds of curves), each curve is
cut after 10%, 25% and 50% of its epochs; the predictor
(``thrifty.perfmodels.learning_curve.forecast``) sees only that prefix and
predicts the validation accuracy at the last epoch. Printed per prefix:

- coverage of the central 90% predictive interval [q05, q95] of the held-out
  final value (target 85-95%), and how often the value fell below / above it;
- mean absolute error of the predictive mean, next to the naive forecast
  "the final value equals the last observed value";
- the median interval width;
- the wall time of one ``forecast`` call (median, p95; target <= 50 ms) and of
  one ``prob_at_least`` query on a fresh forecast.

The same table is printed again under the `TrialPrior` learned from the
other half of the set (as if those trials had run to the end): what an
experiment's forecasts look like once some of its trials have run longer.

A second table checks the quantity POP reads, the first-passage probability
that some later epoch reaches a target accuracy (`prob_reached_by` up to the
last epoch), from the 8% and 16% prefixes (POP's first boundaries, epochs 4
and 8 of 50) at each set's three targets (`TARGETS`, headline first):
expected count (the sum of the probabilities) against the curves that did
reach it, the Brier score, and the ranking quality (AUC) next to that of the
best accuracy seen so far. Rows per model: ``warped`` (the default: log
headroom), ``warped + trial prior`` (`TrialPrior` learned from the other
half of the same set, as if those trials had run to the end), and
``unwarped`` (the model before issue 19, ``warp="none"`` with its discrepancy
1.3).

Split. The predictor's global settings (`CurvePrior`: the discrepancy scale
and its clock) were chosen with ``--tune`` on the digits-mlp traces with an
EVEN index (the tuning half) by the mean 90% interval score (Gneiting and
Raftery 2007, a proper score for the interval: width plus 20 x the miss
distance); the tables are on the digits ODD half, which the tuning never saw,
and on the noisy-digits-cnn traces (a different model, data set and kind of
curve). ``--tune`` prints the whole search. One choice was revised after
seeing the second set: with the warp, ``--tune`` on the digits half prefers
the log clock, which over-predicted first passage on noisy-digits-cnn about
sevenfold; the default keeps the hyperbolic clock and scale 1.3 that the
digits half chose for the unwarped model (see the docstring of
`thrifty.perfmodels.learning_curve`).

Run: ``python benchmarks/curve_calibration.py [--tune] [--all]``.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

from thrifty.datasets.curves import Trace, load_traces
from thrifty.perfmodels.learning_curve import TIME_SCALES, CurvePrior, TrialPrior, forecast

PREFIXES = (0.10, 0.25, 0.50)
ALPHA = 0.10  # central 90% interval
TUNE_DISCREPANCY = (0.3, 0.45, 0.6, 0.8, 1.0, 1.3)
TUNING_SET = "digits-mlp"
# per trace set: the headline target (the accuracy about 5% of its configurations reach) and two lower ones
TARGETS = {"digits-mlp": (0.983, 0.98, 0.975), "noisy-digits-cnn": (0.795, 0.785, 0.775)}
UNWARPED = CurvePrior(warp="none", discrepancy=1.3)  # the model before issue 19


@dataclass(frozen=True)
class Outcome:
    final: float
    last: float
    lo: float
    hi: float
    mean: float
    forecast_s: float
    query_s: float

    @property
    def covered(self) -> bool:
        return self.lo <= self.final <= self.hi

    @property
    def interval_score(self) -> float:
        miss = max(self.lo - self.final, 0.0) + max(self.final - self.hi, 0.0)
        return (self.hi - self.lo) + 2.0 / ALPHA * miss


def predict_final(trace: Trace, fraction: float, prior: CurvePrior, learned: TrialPrior | None = None) -> Outcome:
    epochs = trace.epochs
    n = max(1, int(round(fraction * epochs)))
    seen = trace.accuracy[:n]
    start = time.perf_counter()
    dist = forecast(np.arange(1, n + 1), seen, epochs, prior=prior if learned is None else learned.for_curve(seen))
    forecast_s = time.perf_counter() - start
    start = time.perf_counter()
    dist.prob_at_least(float(seen.max()), epochs)
    query_s = time.perf_counter() - start
    return Outcome(
        final=float(trace.accuracy[-1]),
        last=float(seen[-1]),
        lo=dist.quantile(ALPHA / 2, epochs),
        hi=dist.quantile(1 - ALPHA / 2, epochs),
        mean=dist.mean(epochs),
        forecast_s=forecast_s,
        query_s=query_s,
    )


def evaluate(traces: list[Trace], prior: CurvePrior, learned: TrialPrior | None = None) -> dict[float, list[Outcome]]:
    return {f: [predict_final(t, f, prior, learned) for t in traces] for f in PREFIXES}


def mean_interval_score(results: dict[float, list[Outcome]]) -> float:
    return statistics.fmean(o.interval_score for outs in results.values() for o in outs)


def summary_rows(results: dict[float, list[Outcome]], epochs: int) -> list[list[str]]:
    rows = []
    for fraction, outs in results.items():
        n = len(outs)
        ms = np.array([o.forecast_s for o in outs]) * 1e3
        rows.append([
            f"{fraction:.0%} ({max(1, int(round(fraction * epochs)))} ep)",
            str(n),
            f"{np.mean([o.covered for o in outs]):.1%}",
            f"{np.mean([o.final < o.lo for o in outs]):.1%}",
            f"{np.mean([o.final > o.hi for o in outs]):.1%}",
            f"{np.mean([abs(o.mean - o.final) for o in outs]):.3f}",
            f"{np.mean([abs(o.last - o.final) for o in outs]):.3f}",
            f"{np.median([o.hi - o.lo for o in outs]):.3f}",
            f"{np.median(ms):.1f}",
            f"{np.percentile(ms, 95):.1f}",
            f"{np.median([o.query_s for o in outs]) * 1e3:.2f}",
        ])
    return rows


HEADER = ["prefix", "curves", "cover 90%", "below", "above", "MAE mean", "MAE last", "width",
          "ms med", "ms p95", "query ms"]


REACH_PREFIXES = (4, 8)  # epochs: POP's first two boundaries (b = 4)
REACH_HEADER = ["model", "prefix", "target", "reached", "expected", "Brier", "AUC forecast", "AUC best so far"]


def auc(score: np.ndarray, positive: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counting one half."""
    pos, neg = score[positive][:, None], score[~positive][None, :]
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    return float(np.mean((pos > neg) + 0.5 * (pos == neg)))


def reach_rows(traces: list[Trace], prior: CurvePrior, targets: tuple[float, ...],
               learned: TrialPrior) -> list[list[str]]:
    """Calibration and ranking of first-passage probabilities (see the module
    docstring); `learned`: the trial prior from the other traces."""
    rows = []
    epochs = traces[0].epochs
    models = {"warped": lambda seen: prior, "warped + trial prior": learned.for_curve,
              "unwarped": lambda seen: UNWARPED}
    for name, prior_for in models.items():
        for n in REACH_PREFIXES:
            dists = [forecast(np.arange(1, n + 1), t.accuracy[:n], epochs, prior=prior_for(t.accuracy[:n]))
                     for t in traces]
            best = np.array([t.accuracy[:n].max() for t in traces])
            for target in targets:
                later = np.array([t.accuracy[n:].max() >= target for t in traces])
                p = np.array([d.prob_reached_by(target, n + 1, epochs)[-1] for d in dists])
                rows.append([name, f"{n} ep", f"{target:g}", str(int(later.sum())), f"{p.sum():.1f}",
                             f"{np.mean((p - later) ** 2):.3f}", f"{auc(p, later):.3f}", f"{auc(best, later):.3f}"])
    return rows


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))


def long_curve_timing(repeats: int = 30) -> tuple[float, float]:
    """Median and p95 ms of one forecast from a 100-point curve (the interface's upper size)."""
    rng = np.random.default_rng(0)
    x = np.arange(1, 101)
    y = np.clip(0.95 - 0.8 * x**-0.7 + rng.normal(0, 0.01, x.size), 0, 1)
    times = []
    for seed in range(repeats):
        start = time.perf_counter()
        forecast(x, y, 300, seed=seed)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times)), float(np.percentile(times, 95))


def tune(tuning: list[Trace]) -> CurvePrior:
    print("tuning half: mean 90% interval score (lower is better) and coverage per prefix")
    best, best_score = None, np.inf
    rows = []
    for scale, disc in itertools.product(TIME_SCALES, TUNE_DISCREPANCY):
        prior = replace(CurvePrior(), time_scale=scale, discrepancy=disc)
        results = evaluate(tuning, prior)
        score = mean_interval_score(results)
        rows.append([scale, f"{disc:g}", f"{score:.4f}"]
                    + [f"{np.mean([o.covered for o in outs]):.1%}" for outs in results.values()])
        if score < best_score:
            best, best_score = prior, score
    print_table(["clock", "discrepancy", "score"] + [f"cover {f:.0%}" for f in PREFIXES], rows)
    print(f"chosen: time_scale={best.time_scale} discrepancy={best.discrepancy:g} "
          f"(defaults: {CurvePrior().time_scale}, {CurvePrior().discrepancy:g})\n")
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tune", action="store_true", help="search the global settings on the tuning half first")
    parser.add_argument("--all", action="store_true", help="also print the table for the tuning half")
    args = parser.parse_args(argv)

    traces = load_traces(TUNING_SET)
    tuning, held_out = traces[0::2], traces[1::2]
    prior = tune(tuning) if args.tune else CurvePrior()
    print(f"settings: warp={prior.warp} time_scale={prior.time_scale} discrepancy={prior.discrepancy:g} "
          f"(chosen on the even half of {TUNING_SET})")
    other = load_traces("noisy-digits-cnn")
    parts = [(f"{TUNING_SET}, held-out half (odd index)", held_out, tuning, TARGETS[TUNING_SET]),
             ("noisy-digits-cnn, every trace (not the tuning set)", other, other, TARGETS["noisy-digits-cnn"])]
    if args.all:
        parts.append((f"{TUNING_SET}, tuning half (even index)", tuning, held_out, TARGETS[TUNING_SET]))
    for title, part, references, targets in parts:
        epochs = part[0].epochs
        results = evaluate(part, prior)
        print(f"\n{title}: {len(part)} curves of {epochs} epochs; final accuracy from a prefix; "
              f"mean 90% interval score {mean_interval_score(results):.4f}")
        print_table(HEADER, summary_rows(results, epochs))
        if references is part:  # the trial prior never learns from the curve it forecasts
            evens, odds = part[0::2], part[1::2]
            forecast_part, references = odds, evens
            note = "odd-index traces, trial prior from the even-index ones"
        else:
            forecast_part = part
            note = "trial prior from the other half"
        learned = TrialPrior.of([t.accuracy for t in references], epochs, base=prior)
        results = evaluate(forecast_part, prior, learned)
        print(f"\n{title}: the same under the trial prior ({note}); mean 90% interval score "
              f"{mean_interval_score(results):.4f}")
        print_table(HEADER, summary_rows(results, epochs))
        rows = reach_rows(forecast_part, prior, targets, learned)
        print(f"\n{title}: does a later epoch reach the target? (first passage, what POP reads; {note})")
        print_table(REACH_HEADER, rows)
    med, p95 = long_curve_timing()
    print(f"\nforecast from a 100-point curve: median {med:.1f} ms, p95 {p95:.1f} ms (target <= 50 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
