"""A run as a person reads it: the timeline of its key events (as in Srifty's
Figure 8, the timeline of reacting to a service interrupt) and a plot of
progress and cost against the plans' predictions and the limits, both made
from the run log alone (`runlog.read_run_log`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from thrifty.runtime.plots import LineStyle, PlotRecord, literal_text, pyplot, save_png, wrap_title

__all__ = ["timeline", "format_timeline", "plot_run", "run_figure"]

_KEY_EVENTS = ("start", "launch", "world_formed", "calibration", "infeasible_forecast", "preemption", "slowdown",
               "replan", "replan_kept", "replan_infeasible", "segment_end", "finish", "error")


def _describe(e: dict[str, Any]) -> str:
    kind = e["event"]
    if kind == "start":
        p = e["plan"]["predicted"] or {}
        return (f"plan {_config(e['plan'])}: {e['iterations']} iterations predicted to take "
                f"{p.get('total_s', float('nan')):.1f} s and ${p.get('cost_usd', float('nan')):.4f}"
                + _limits(e.get("limits") or {}))
    if kind == "launch":
        return f"segment {e['segment']}: {e['world_size']} workers {e['config']} from iteration {e['start_iteration']}"
    if kind == "world_formed":
        return f"segment {e['segment']}: world formed {e['since_launch_s']:.1f} s after asking for machines"
    if kind == "preemption":
        left = "no notice" if not e.get("time_left_s") else f"{e['time_left_s']:g} s notice"
        return (f"{e['instance_type']} ({e['market']}) {e.get('machine_id') or ''} preempted ({e['source']}, "
                f"{left}) at iteration {e.get('iteration')}")
    if kind == "slowdown":
        finish = e["optimistic_total_s"]
        when = "no progress in a whole window" if finish is None else f"optimistic finish {finish:.1f} s"
        return f"violation certain ({', '.join(e['violation'])}): {when}"
    if kind == "replan":
        p = e["plan"]["predicted"]
        limits = e["problem"]["limits"]
        late = f"; best effort, the soonest within the budget: {e['best_effort']}" if e.get("best_effort") else ""
        assumed = f"; assuming {e['assumed']}" if e.get("assumed") else ""
        return (f"re-planned ({e['reason']}) in {e['latency_s'] * 1e3:.0f} ms: {e['new_config']} for "
                f"{e['problem']['iterations']} iterations, predicted {p['total_s']:.1f} s (launch "
                f"{e['problem']['launch_s']:.1f} s) and ${p['cost_usd']:.4f}" + _limits(limits, left=True) + late
                + assumed)
    if kind == "calibration":
        return (f"segment {e['segment']} window {e['window']}: iteration " + _iteration_check(
            e["prior"]["iteration_s"], e["corrected"]["iteration_s"], e["measured"]["iteration_s"])
            + f"; assuming {e['assumed']}")
    if kind == "infeasible_forecast":
        return f"limits out of reach by the corrected models (window {e['window']}): " + "; or ".join(
            _relaxation_words(r) for r in e["relaxations"])
    if kind == "replan_kept":
        return f"re-planned: keep {e['config']}"
    if kind == "replan_infeasible":
        assumed = f" (assuming {e['assumed']})" if e.get("assumed") else ""
        return f"re-planned ({e['reason']}): no plan meets what is left{assumed}; going on as planned"
    if kind == "segment_end":
        lost = f", {e['lost_iterations']} iterations lost" if e["lost_iterations"] else ""
        check = _prediction_check(e)
        return (f"segment {e['index']} {e['ended']} at iteration {e['reached_iteration']} "
                f"(checkpoint {e['committed_iteration']}{lost})" + (f"; iteration {check}" if check else ""))
    if kind == "finish":
        ok = "within" if e["within_limits"] else "OUTSIDE"
        return (f"finished {e['iterations']} iterations in {e['elapsed_s']:.1f} s for ${e['cost_usd']:.4f}, "
                f"{ok} the limits" + _limits({"time_s": e.get("time_limit_s"), "cost_usd": e.get("cost_limit_usd")}))
    if kind == "error":
        return e["error"]
    return kind


def _config(plan: dict[str, Any]) -> str:
    return "+".join(f"{a['count']}x{a['instance_type']}@{a['batch_per_instance']}" for a in plan["allocation"])


def _prediction_check(segment_end: dict) -> str:
    """``50.0 ms measured, 40.0 ms predicted (1.25x)``: a segment's steady-state
    iteration time against its plan's prediction ("" when either is unknown),
    and what the models corrected online predicted for it at its end
    (``, 49.0 ms corrected``)."""
    actual, predicted = segment_end.get("actual_iteration_s"), segment_end.get("predicted_iteration_s")
    if not actual or not predicted:
        return ""
    corrected = segment_end.get("corrected_iteration_s")
    return (f"{actual * 1e3:,.1f} ms measured, {predicted * 1e3:,.1f} ms predicted ({actual / predicted:.2f}x)"
            + (f", {corrected * 1e3:,.1f} ms corrected ({actual / corrected:.2f}x)" if corrected else ""))


def _iteration_check(prior: float, corrected: float, measured: float | None) -> str:
    """A calibration window's iteration: prior, corrected and measured."""
    return (f"{prior * 1e3:,.1f} ms prior, {corrected * 1e3:,.1f} ms corrected"
            + (f", {measured * 1e3:,.1f} ms measured" if measured else ""))


def _relaxation_words(r: dict[str, Any]) -> str:
    needed = r.get("needed_total")
    if isinstance(needed, dict):
        words = " and ".join(_limit_value(f, v) for f, v in needed.items())
    elif needed is not None:
        words = _limit_value(r.get("field") or "", needed)
    else:
        words = f"{r.get('field') or r.get('fields')} -> {r.get('needed')}"
    return f"{words} ({r.get('plan')})"


def _limit_value(field: str, value: float) -> str:
    return f"time limit {value:.1f} s" if field == "limits.time_s" else f"budget ${value:.4f}"


def format_prediction_check(segments: list[dict]) -> str:
    """One line: each segment's measured against predicted iteration time, the
    check that the plan's prediction held ("" when no segment ran long enough
    to measure a steady state)."""
    checks = [(s, _prediction_check(s)) for s in segments]
    parts = [f"segment {s['index']} {s['config']}: {check}" for s, check in checks if check]
    return "iteration time, measured vs predicted: " + "; ".join(parts) if parts else ""


def _limits(limits: dict[str, Any], left: bool = False) -> str:
    parts = []
    if limits.get("time_s") is not None:
        parts.append(f"{limits['time_s']:.1f} s")
    if limits.get("cost_usd") is not None:
        parts.append(f"${limits['cost_usd']:.4f}")
    return f" ({' and '.join(parts)} {'left' if left else 'limits'})" if parts else ""


def timeline(events: Sequence[dict[str, Any]]) -> list[tuple[float, str, str]]:
    """(elapsed seconds, event, description) for the key events of a run; of
    the calibration windows, each segment's first and last."""
    windows: dict[Any, list[int]] = {}
    for e in events:
        if e["event"] == "calibration":
            windows.setdefault(e["segment"], []).append(e["window"])
    shown = {w for ws in windows.values() for w in (ws[0], ws[-1])}
    return [(e["elapsed_s"], e["event"], _describe(e)) for e in events if e["event"] in _KEY_EVENTS
            and (e["event"] != "calibration" or e["window"] in shown)]


def format_timeline(rows: Sequence[tuple[float, str, str]]) -> str:
    lines = [f"{'t (s)':>8}  {'event':<13} what happened"]
    lines += [f"{t:8.2f}  {kind:<13} {text}" for t, kind, text in rows]
    return "\n".join(lines)


# event: (line style, marker at the top of the axes, label); distinct even when at one time
_MARKERS: dict[str, tuple[LineStyle, str, str]] = {
    "preemption": ({"color": "#c44e52", "lw": 1.6, "ls": "-"}, "v", "preemption"),
    "replan": ({"color": "#8172b2", "lw": 1.4, "ls": (0, (5, 2, 1, 2))}, "D", "re-plan"),
    "replan_kept": ({"color": "#937860", "lw": 1.2, "ls": (0, (1, 2))}, "o", "re-plan: plan kept"),
    "replan_infeasible": ({"color": "#937860", "lw": 1.2, "ls": (0, (3, 2))}, "X", "re-plan: no plan fits"),
    "slowdown": ({"color": "#dd8452", "lw": 1.2, "ls": (0, (1, 1))}, "s", "violation certain"),
    "infeasible_forecast": ({"color": "#c44e52", "lw": 1.2, "ls": (0, (2, 1))}, "P", "limits out of reach (forecast)"),
}
_NUDGE_PT = 3.5      # points between event lines that fall at (nearly) the same time
_CLOSE_SHARE = 0.02  # events closer than this share of the time axis (about a marker's width) are nudged
_MARKER_STEP_PT = 12  # points between the stacked markers of events that are nudged apart
_PREDICTED_COLORS = ["#55a868", "#dd8452", "#8172b2", "#937860"]


def _event_marks(events: Sequence[dict[str, Any]], span_s: float) -> list[tuple[str, float, float]]:
    """(event, time, offset in points) of the events drawn as vertical lines:
    an event within `_CLOSE_SHARE` of the time axis of the one before it is
    moved `_NUDGE_PT` points further right (and its marker one step down), so
    lines and markers at one time stay apart."""
    marks: list[tuple[str, float, float]] = []
    for e in sorted((e for e in events if e["event"] in _MARKERS), key=lambda e: e["elapsed_s"]):
        t = e["elapsed_s"]
        offset = 0.0
        if marks and t - marks[-1][1] <= _CLOSE_SHARE * span_s:
            offset = marks[-1][2] + _NUDGE_PT
        marks.append((e["event"], t, offset))
    return marks


def _mark_text(kind: str, events: Sequence[dict[str, Any]], t: float) -> str:
    e = next(e for e in events if e["event"] == kind and e["elapsed_s"] == t)
    if kind == "preemption":
        return f"{e.get('machine_id') or e['instance_type']} preempted"
    if kind == "replan":
        return f"re-planned: {e['new_config']}"
    return _MARKERS[kind][2]


def _predictions(events: Sequence[dict[str, Any]]) -> list[tuple[str, list[tuple[float, float]]]]:
    """(configuration, predicted progress) of the first plan and of each
    re-plan: flat while machines launch, then straight to the last iteration."""
    start = next(e for e in events if e["event"] == "start")
    total = start["iterations"]
    predicted = start["plan"]["predicted"]
    launch = predicted["total_s"] - total * predicted["iteration_s"]
    out = [(_config(start["plan"]), [(0.0, 0), (launch, 0), (predicted["total_s"], total)])]
    for e in events:
        if e["event"] == "replan":
            t0, done, p = e["elapsed_s"], total - e["problem"]["iterations"], e["plan"]["predicted"]
            out.append((e["new_config"], [(t0, done), (t0 + e["problem"]["launch_s"], done),
                                          (t0 + p["total_s"], total)]))
    return out


def _draw_progress(ax, events: Sequence[dict[str, Any]], rec, handles: list) -> None:
    """Iterations done (reports and checkpoints) and each plan's prediction."""
    from matplotlib.lines import Line2D

    progress = sorted([(e["elapsed_s"], e["iterations"]) for e in events if e["event"] == "throughput"]
                      + [(e["elapsed_s"], e["iteration"]) for e in events if e["event"] == "checkpoint"])
    if progress:
        ax.plot(*zip(*progress), ".-", color="#4c72b0", ms=4, zorder=3)
        handles.append(Line2D([], [], color="#4c72b0", marker=".", label="actual (reports and checkpoints)"))
        rec.series["actual"] = progress
    for k, (config, line) in enumerate(_predictions(events)):
        color = _PREDICTED_COLORS[k % len(_PREDICTED_COLORS)]
        ax.plot(*zip(*line), "--", color=color, lw=1.4, zorder=2)
        handles.append(Line2D([], [], color=color, ls="--", label=f"predicted: {config}"))
        rec.series[f"predicted: {config}"] = line


def _draw_spent(ax, events: Sequence[dict[str, Any]], budget: float | None, rec, handles: list) -> None:
    """The money spent over time, and the budget (with room above it for the event markers)."""
    from matplotlib.lines import Line2D

    spent = [(e["elapsed_s"], e["spent_usd"]) for e in events if e["event"] == "throughput"]
    finish = next((e for e in events if e["event"] == "finish"), None)
    if finish is not None:
        spent.append((finish["elapsed_s"], finish["cost_usd"]))
    spent.sort()
    if spent:
        ax.step(*zip(*spent), where="post", color="#4c72b0", marker=".", ms=4, zorder=3)
        handles.append(Line2D([], [], color="#4c72b0", label="spent (per-second billing, 60 s minimum)"))
        rec.series["spent"] = spent
    if budget is not None:
        ax.axhline(budget, color="#dd8452", ls="--", lw=1)
        handles.append(Line2D([], [], color="#dd8452", ls="--", label=f"budget ${budget:g}"))
    top = max([c for _, c in spent] + [budget or 0.0]) or 1.0
    ax.set_ylim(0, top * 1.18)


def _draw_calibration(ax, events: Sequence[dict[str, Any]], rec, handles: list) -> None:
    """Iteration time per calibration window: what the prior profile
    predicted, what the models corrected by the window predict, and what the
    window measured; each segment's plan prediction as a flat line."""
    from matplotlib.lines import Line2D

    windows = [e for e in events if e["event"] == "calibration"]
    series = {"prior": [(e["elapsed_s"], e["prior"]["iteration_s"] * 1e3) for e in windows],
              "corrected": [(e["elapsed_s"], e["corrected"]["iteration_s"] * 1e3) for e in windows],
              "measured": [(e["elapsed_s"], e["measured"]["iteration_s"] * 1e3) for e in windows
                           if e["measured"]["iteration_s"]]}
    styles = {"prior": ("--", "#55a868", "o"), "corrected": ("-", "#c44e52", "D"), "measured": (":", "#4c72b0", ".")}
    for name, points in series.items():
        if not points:
            continue
        ls, color, marker = styles[name]
        ax.plot(*zip(*points), ls=ls, color=color, marker=marker, ms=4, zorder=3)
        handles.append(Line2D([], [], ls=ls, color=color, marker=marker, label=f"iteration time: {name}"))
        rec.series[f"iteration {name}"] = points
    ax.set_ylim(0, max([v for pts in series.values() for _, v in pts] + [1.0]) * 1.2)


def _draw_marks(fig, axes, events: Sequence[dict[str, Any]], marks, handles: list) -> None:
    """A vertical line on every panel for each event of `marks`, moved right
    by its offset, with a marker on top (stacked downwards when nudged), and
    on the first panel the event's name when there are few."""
    from matplotlib import transforms
    from matplotlib.lines import Line2D

    seen = set()
    for k, (kind, t, offset) in enumerate(marks):
        style, marker, label = _MARKERS[kind]
        level = round(offset / _NUDGE_PT)
        for ax in axes:
            line = transforms.offset_copy(ax.get_xaxis_transform(), fig=fig, x=offset, units="points")
            ax.plot([t, t], [0, 1], transform=line, zorder=4, **style)
            top = transforms.offset_copy(ax.get_xaxis_transform(), fig=fig, x=offset,
                                         y=-_MARKER_STEP_PT * level, units="points")
            ax.plot([t], [1.0], transform=top, marker=marker, ms=7, color=style["color"], mec="black",
                    mew=0.6, clip_on=False, zorder=5)
        if len(marks) <= 6:  # name each event beside its marker, away from the one it shares a time with
            left = level == 0 and k + 1 < len(marks) and marks[k + 1][2] > 0
            at = transforms.offset_copy(axes[0].get_xaxis_transform(), fig=fig, x=offset + (-7 if left else 7),
                                        y=-_MARKER_STEP_PT * level - (4 if level == 0 else 0), units="points")
            axes[0].text(t, 1.0, _mark_text(kind, events, t), transform=at, fontsize=7.5,
                         va="top" if level == 0 else "center", ha="right" if left else "left",
                         color=style["color"], zorder=6,
                         bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
        if kind not in seen:
            seen.add(kind)
            handles.append(Line2D([], [], marker=marker, ms=6, mec="black", mew=0.6, **style, label=label))


@literal_text
def run_figure(events: Sequence[dict[str, Any]], title: str | None = None):
    """The figure of `plot_run` and a record of what it drew
    (`thrifty.runtime.plots.PlotRecord`: series ``actual``, ``spent`` and
    ``predicted: CONFIG``; with calibration windows a third panel, series
    ``iteration prior``, ``iteration corrected`` and ``iteration measured``;
    ``notes["marks"]``, the (event, time, offset in points) of each event
    line; ``notes["handles"]``, the legend's labels)."""
    from matplotlib.lines import Line2D

    plt = pyplot()
    calibrated = any(e["event"] == "calibration" for e in events)
    fig, axes = plt.subplots(3 if calibrated else 2, 1, figsize=(8, 9.5 if calibrated else 7), dpi=120, sharex=True,
                             layout="constrained")
    ax_it, ax_cost = axes[0], axes[1]
    rec = PlotRecord()
    handles: list = []
    start = next(e for e in events if e["event"] == "start")
    limits = start.get("limits") or {}
    _draw_progress(ax_it, events, rec, handles)
    _draw_spent(ax_cost, events, limits.get("cost_usd"), rec, handles)
    if calibrated:
        _draw_calibration(axes[2], events, rec, handles)
        axes[2].set_ylabel("iteration time (ms)")
    if limits.get("time_s") is not None:
        for ax in axes:
            ax.axvline(limits["time_s"], color="black", ls="--", lw=1)
        handles.append(Line2D([], [], color="black", ls="--", label=f"time limit {limits['time_s']:g} s"))
    times = [e["elapsed_s"] for e in events] + [v for v in (limits.get("time_s"),) if v is not None]
    rec.notes["marks"] = _event_marks(events, max(times) - min(times) or 1.0)
    _draw_marks(fig, tuple(axes), events, rec.notes["marks"], handles)
    total = start["iterations"]
    ax_it.set_ylim(-0.03 * total, total * 1.2)  # a band above the finish for the events' names
    ax_it.set_ylabel("iterations done")
    ax_cost.set_ylabel("spent (USD)")
    axes[-1].set_xlabel("time since start (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    rec.title = wrap_title(title or "training run: progress against the plans", 8, 12)
    fig.suptitle(rec.title, fontsize=12)
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    rec.notes["handles"] = [h.get_label() for h in handles]
    return fig, rec


def plot_run(events: Sequence[dict[str, Any]], path: str | Path, title: str | None = None):
    """Iterations and spent cost over time, each plan's predicted progress,
    the preemptions and re-plans (lines with a marker on top, moved apart when
    they fall at one time), and the limits; returns what it drew (`run_figure`)."""
    fig, rec = run_figure(events, title)
    save_png(pyplot(), fig, path)
    return rec
