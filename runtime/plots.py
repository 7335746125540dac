"""Plots a person would rather look at than read (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_training_plan"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training_plan(space, plan, path: str | Path) -> None:
    """Every simulated candidate in the time-cost plane, the limits, and the plan."""
    from thrifty.datasets.io import atomic_write_bytes
    import io

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    hist = space.history
    ok = [e for e in hist if e.feasible]
    bad = [e for e in hist if not e.feasible]
    if bad:
        ax.scatter([e.total_s for e in bad], [e.cost_usd for e in bad], s=10, c="#bbbbbb",
                   label=f"infeasible candidates ({len(bad)})")
    if ok:
        ax.scatter([e.total_s for e in ok], [e.cost_usd for e in ok], s=12, c="#4c72b0",
                   label=f"feasible candidates ({len(ok)})")
    limits = space.problem.limits
    if limits.time_s is not None:
        ax.axvline(limits.time_s, color="#c44e52", ls="--", lw=1, label=f"time limit {limits.time_s:g} s")
    if limits.cost_usd is not None:
        ax.axhline(limits.cost_usd, color="#dd8452", ls="--", lw=1, label=f"budget ${limits.cost_usd:g}")
    if plan.feasible:
        p = plan.predicted
        ax.errorbar([p.total_s], [p.cost_usd], xerr=[[0], [p.total_s_p95 - p.total_s]], fmt="*", ms=16,
                    color="#55a868", mec="black", label=f"plan: {plan.config}")
    ax.set_xlabel("predicted total time (s)")
    ax.set_ylabel("predicted cost (USD)")
    ax.set_title(f"{space.problem.name or space.problem.model}: {plan.status} "
                 f"({plan.solver.method}, {plan.solver.candidates_simulated} simulated)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
