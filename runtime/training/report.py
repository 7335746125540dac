"""A run as a person reads it: the timeline of its key events (as in Srifty's
Figure 8, the timeline of reacting to a service interrupt) and a plot of
progress and cost against the plans' predictions and the limits, both made
from the run log alone (`runlog.read_run_log`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["timeline", "format_timeline", "plot_run"]

_KEY_EVENTS = ("start", "launch", "world_formed", "preemption", "slowdown", "replan", "replan_kept",
               "replan_infeasible", "segment_end", "finish", "error")


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
        return (f"re-planned ({e['reason']}) in {e['latency_s'] * 1e3:.0f} ms: {e['new_config']} for "
                f"{e['problem']['iterations']} iterations, predicted {p['total_s']:.1f} s (launch "
                f"{e['problem']['launch_s']:.1f} s) and ${p['cost_usd']:.4f}" + _limits(limits, left=True))
    if kind == "replan_kept":
        return f"re-planned: keep {e['config']}"
    if kind == "replan_infeasible":
        return f"re-planned ({e['reason']}): no plan meets what is left; going on as planned"
    if kind == "segment_end":
        lost = f", {e['lost_iterations']} iterations lost" if e["lost_iterations"] else ""
        return (f"segment {e['index']} {e['ended']} at iteration {e['reached_iteration']} "
                f"(checkpoint {e['committed_iteration']}{lost})")
    if kind == "finish":
        ok = "within" if e["within_limits"] else "OUTSIDE"
        return (f"finished {e['iterations']} iterations in {e['elapsed_s']:.1f} s for ${e['cost_usd']:.4f}, "
                f"{ok} the limits" + _limits({"time_s": e.get("time_limit_s"), "cost_usd": e.get("cost_limit_usd")}))
    if kind == "error":
        return e["error"]
    return kind


def _config(plan: dict[str, Any]) -> str:
    return "+".join(f"{a['count']}x{a['instance_type']}@{a['batch_per_instance']}" for a in plan["allocation"])


def _limits(limits: dict[str, Any], left: bool = False) -> str:
    parts = []
    if limits.get("time_s") is not None:
        parts.append(f"{limits['time_s']:.1f} s")
    if limits.get("cost_usd") is not None:
        parts.append(f"${limits['cost_usd']:.4f}")
    return f" ({' and '.join(parts)} {'left' if left else 'limits'})" if parts else ""


def timeline(events: Sequence[dict[str, Any]]) -> list[tuple[float, str, str]]:
    """(elapsed seconds, event, description) for the key events of a run."""
    return [(e["elapsed_s"], e["event"], _describe(e)) for e in events if e["event"] in _KEY_EVENTS]


def format_timeline(rows: Sequence[tuple[float, str, str]]) -> str:
    lines = [f"{'t (s)':>8}  {'event':<13} what happened"]
    lines += [f"{t:8.2f}  {kind:<13} {text}" for t, kind, text in rows]
    return "\n".join(lines)


def plot_run(events: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> None:
    """Iterations and spent cost over time, each plan's predicted progress,
    the preemptions and re-plans, and the limits."""
    from thrifty.runtime.plots import pyplot, save_png

    plt = pyplot()
    fig, (ax_it, ax_cost) = plt.subplots(2, 1, figsize=(8, 6.5), dpi=120, sharex=True)
    start = next(e for e in events if e["event"] == "start")
    total = start["iterations"]
    progress = sorted((e["elapsed_s"], e["iterations"]) for e in events if e["event"] == "throughput")
    progress += [(e["elapsed_s"], e["iteration"]) for e in events if e["event"] == "checkpoint"]
    progress.sort()
    if progress:
        ax_it.plot([t for t, _ in progress], [n for _, n in progress], ".-", color="#4c72b0", ms=3,
                   label="actual (reports and checkpoints)")
    predictions = [(0.0, 0, start["plan"]["predicted"], _config(start["plan"]), None)]
    for e in events:
        if e["event"] == "replan":
            base = total - e["problem"]["iterations"]
            predictions.append((e["elapsed_s"], base, e["plan"]["predicted"], e["new_config"], e["problem"]["launch_s"]))
    colors = ["#55a868", "#dd8452", "#8172b2", "#937860"]
    for k, (t0, base, predicted, config, launch) in enumerate(predictions):
        launch = start["plan"]["predicted"]["total_s"] - total * predicted["iteration_s"] if launch is None else launch
        t_run = t0 + launch
        t_end = t0 + predicted["total_s"]
        ax_it.plot([t0, t_run, t_end], [base, base, total], "--", color=colors[k % len(colors)],
                   label=f"predicted: {config}")
    spent = [(e["elapsed_s"], e["spent_usd"]) for e in events if e["event"] == "throughput"]
    finish = next((e for e in events if e["event"] == "finish"), None)
    if finish is not None:
        spent.append((finish["elapsed_s"], finish["cost_usd"]))
    if spent:
        ax_cost.step([t for t, _ in spent], [c for _, c in spent], where="post", color="#4c72b0",
                     label="spent (per-second billing, 60 s minimum)")
    limits = start.get("limits") or {}
    for ax in (ax_it, ax_cost):
        for e in events:
            if e["event"] == "preemption":
                ax.axvline(e["elapsed_s"], color="#c44e52", lw=1.2)
            elif e["event"] == "replan":
                ax.axvline(e["elapsed_s"], color="#8172b2", lw=1, ls=":")
        if limits.get("time_s") is not None:
            ax.axvline(limits["time_s"], color="black", ls="--", lw=1)
    ax_it.plot([], [], color="#c44e52", label="preemption")
    ax_it.plot([], [], color="#8172b2", ls=":", label="re-plan")
    if limits.get("time_s") is not None:
        ax_it.plot([], [], color="black", ls="--", label=f"time limit {limits['time_s']:g} s")
    if limits.get("cost_usd") is not None:
        ax_cost.axhline(limits["cost_usd"], color="#dd8452", ls="--", lw=1, label=f"budget ${limits['cost_usd']:g}")
    ax_it.set_ylabel("iterations done")
    ax_it.set_title(title or "training run: progress against the plans")
    ax_cost.set_ylabel("spent (USD)")
    ax_cost.set_xlabel("time since start (s)")
    for ax in (ax_it, ax_cost):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    save_png(plt, fig, path)
