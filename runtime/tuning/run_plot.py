"""The plot of a tuning run (``DIR/tuning.png``), from its event log.

Two panels on one time axis (seconds since the experiment started):

- top: every trial's metric over time, one line per trial; the five best
  trials in colour (the best one thicker, labelled with its configuration),
  the others in grey; the target and the deadline as dashed lines; the best
  value so far as a step line;
- bottom: atoms over time, stacked by trial in the same colours, under the
  number of atoms the experiment has, so idle atoms, pauses and resizes
  (HyperSched growing its best trials) show at a glance.

`tuning_run_figure` returns the figure and a `PlotRecord` of what it drew,
as the other plots do (`thrifty.runtime.plots`).
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from thrifty.runtime.plots import PlotRecord, literal_text, pyplot, save_png, wrap_title

__all__ = ["tuning_run_figure", "plot_tuning_run", "trial_series", "atom_intervals"]

TOP = 5
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")


def trial_series(events: list[dict[str, Any]]) -> dict[int, list[tuple[float, float]]]:
    """Per trial, (time, metric) of each finite result; a restarted trial keeps only its last start's."""
    series: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("event") == "launch" and int(e.get("from_iteration", 0)) == 0:
            series[e["trial"]] = []
        elif e.get("event") == "result":
            m = e.get("metric")
            if isinstance(m, (int, float)) and math.isfinite(m):
                series.setdefault(e["trial"], []).append((float(e["t"]), float(m)))
    return series


def atom_intervals(events: list[dict[str, Any]], end: float) -> list[tuple[int, float, float, int]]:
    """(trial, start, stop, atoms) for each launch: until its suspend, terminate or crash (or `end`)."""
    open_: dict[int, tuple[float, int]] = {}
    out = []
    for e in events:
        kind, tid = e.get("event"), e.get("trial")
        if not isinstance(tid, int):
            continue
        if kind == "launch":
            if tid in open_:  # launched again without a word in between (a driver killed and resumed)
                start, atoms = open_.pop(tid)
                out.append((tid, start, float(e["t"]), atoms))
            open_[tid] = (float(e["t"]), int(e["atoms"]))
        elif kind in ("suspend", "terminate", "crash") and tid in open_:
            start, atoms = open_.pop(tid)
            out.append((tid, start, float(e["t"]), atoms))
    out += [(tid, start, end, atoms) for tid, (start, atoms) in open_.items()]
    return sorted(out, key=lambda x: (x[1], x[0]))


def _config_text(config: dict[str, Any], keys: list[str]) -> str:
    parts = []
    for k in keys:
        v = config.get(k)
        parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return ", ".join(parts)


@literal_text
def tuning_run_figure(events: list[dict[str, Any]], experiment: Any):
    plt = pyplot()
    e = experiment
    rec = PlotRecord()
    series = trial_series(events)
    end = max((float(ev["t"]) for ev in events if "t" in ev), default=0.0)
    better = (lambda a, b: a > b) if e.mode == "max" else (lambda a, b: a < b)
    best_of = {tid: (max if e.mode == "max" else min)(v for _, v in pts) for tid, pts in series.items() if pts}
    ranked = sorted(best_of, key=lambda tid: (-best_of[tid] if e.mode == "max" else best_of[tid], tid))
    colour = {tid: COLOURS[i] for i, tid in enumerate(ranked[:TOP])}
    configs: dict[int, dict[str, Any]] = {}
    for ev in events:
        if ev.get("event") == "launch" and "config" in ev:
            configs[ev["trial"]] = ev["config"]
    keys = [k for k, v in e.search_space.items() if isinstance(v, dict)]

    fig, (ax, ax_atoms) = plt.subplots(2, 1, figsize=(11, 8.5), sharex=True, height_ratios=(3, 2),
                                       layout="constrained")
    for tid, pts in sorted(series.items(), key=lambda kv: kv[0] in colour):
        if not pts:
            continue
        xs, ys = zip(*pts)
        if tid in colour:
            rank = ranked.index(tid)
            label = f"trial {tid}: best {best_of[tid]:.4g} ({_config_text(configs.get(tid, {}), keys)})"
            ax.plot(xs, ys, color=colour[tid], lw=2.4 if rank == 0 else 1.4, marker="." if len(xs) < 40 else None,
                    label=label, zorder=3 + TOP - rank)
        else:
            ax.plot(xs, ys, color="0.7", lw=0.8, zorder=1)
        rec.series[f"trial {tid}"] = list(pts)
    best_steps: list[tuple[float, float]] = []
    for t, v in sorted((p for pts in series.values() for p in pts)):
        if not best_steps or better(v, best_steps[-1][1]):
            best_steps.append((t, v))
    if best_steps:
        xs, ys = zip(*(best_steps + [(end, best_steps[-1][1])]))
        ax.step(xs, ys, where="post", color="black", lw=1.0, ls=(0, (1, 1)), label="best so far", zorder=10)
        rec.series["best so far"] = best_steps
    if e.target is not None:
        ax.axhline(e.target, color="tab:green", ls="--", lw=1, label=f"target {e.target:g}")
    for a in (ax, ax_atoms):
        if e.deadline_s is not None:
            a.axvline(e.deadline_s, color="tab:red", ls="--", lw=1,
                      label=f"deadline {e.deadline_s:g} s" if a is ax else None)
    values = [v for pts in series.values() for _, v in pts]
    if values:  # the interesting range: from the median of the results to the best (diverged runs at the floor)
        lo, hi = sorted(values)[len(values) // 4], max(values)
        if e.mode == "min":
            lo, hi = min(values), sorted(values)[3 * len(values) // 4]
        pad = max((hi - lo) * 0.08, 1e-3)
        ax.set_ylim(lo - pad, hi + pad)
        rec.notes["ylim"] = (lo - pad, hi + pad)
    ax.set_ylabel(f"{e.metric} ({'higher' if e.mode == 'max' else 'lower'} is better)")
    ax.grid(alpha=0.3)

    intervals = atom_intervals(events, end)
    grid = sorted({0.0, end} | {s for _, s, _, _ in intervals} | {t for _, _, t, _ in intervals})
    layers: dict[int, list[int]] = {}
    for tid, start, stop, atoms in intervals:
        row = layers.setdefault(tid, [0] * len(grid))
        for i, t in enumerate(grid):
            if start <= t < stop:
                row[i] += atoms
    others = [sum(row[i] for tid, row in layers.items() if tid not in colour) for i in range(len(grid))]
    stack = [layers[tid] for tid in ranked[:TOP] if tid in layers] + [others]
    fills = [colour[tid] for tid in ranked[:TOP] if tid in layers] + ["0.75"]
    if len(grid) > 1:
        ax_atoms.stackplot(grid, *stack, colors=fills, step="post", alpha=0.85)
    total = e.atoms if e.scheduler.name != "plan" else None
    if total:
        ax_atoms.axhline(total, color="black", lw=1, label=f"the experiment's {total} atoms")
        ax_atoms.set_ylim(0, total * 1.15)
    handles = ax.get_legend_handles_labels()[0] + ax_atoms.get_legend_handles_labels()[0]
    for h in handles:
        h.set_label(textwrap.fill(h.get_label(), 78, subsequent_indent="  "))
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    rec.notes["handles"] = [h.get_label() for h in handles]
    rec.series["atoms used"] = [(t, float(sum(row[i] for row in layers.values()))) for i, t in enumerate(grid)]
    ax_atoms.set_ylabel("atoms in use (top trials in colour)")
    ax_atoms.set_xlabel("time since the experiment started (s)")
    ax_atoms.grid(alpha=0.3)
    title = (f"{e.name or 'tuning'}: {e.scheduler.name}, {len(series)} trials, "
             f"{sum(len(p) for p in series.values())} results in {end:.0f} s")
    if best_steps:
        title += f"; best {e.metric} {best_steps[-1][1]:.4g} (trial {ranked[0]})"
    rec.title = wrap_title(title, 11)
    fig.suptitle(rec.title, fontsize=11)
    return fig, rec


def plot_tuning_run(events: list[dict[str, Any]], experiment: Any, path: str | Path) -> PlotRecord:
    """`tuning_run_figure` saved to `path` as PNG; returns what it drew."""
    fig, rec = tuning_run_figure(events, experiment)
    save_png(pyplot(), fig, path)
    return rec
