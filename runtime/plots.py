"""Plots a person would rather look at than read (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_training_plan", "plot_tuning_plan", "pyplot", "save_png"]


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(plt, fig, path: str | Path) -> None:
    """Lay out `fig`, write it to `path` as PNG atomically, and close it."""
    import io

    from thrifty.datasets.io import atomic_write_bytes

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def plot_training_plan(space, plan, path: str | Path) -> None:
    """Every simulated candidate in the time-cost plane, the limits, and the plan."""
    plt = pyplot()
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
    save_png(plt, fig, path)


def plot_tuning_plan(plan, path: str | Path) -> None:
    """A tuning plan over time: GPUs per trial and instances per stage, and the
    cumulative cost, for thrifty's plan and the static and greedy baselines."""
    plt = pyplot()
    fig, (ax_gpu, ax_inst, ax_cost) = plt.subplots(3, 1, figsize=(7.5, 7), dpi=120, sharex=True)
    runs = [("thrifty", plan.stages, plan.predicted, "#55a868")]
    for name, color in (("greedy", "#4c72b0"), ("static", "#c44e52")):
        b = plan.baselines.get(name)
        if b and b["predicted"]:
            runs.append((name, b["stages"], b["predicted"], color))
    for name, stages, predicted, color in runs:
        if not stages:
            continue
        xs = [s["start_s"] / 60 for s in stages] + [stages[-1]["end_s"] / 60]
        ax_gpu.step(xs, [s["gpus_per_trial"] for s in stages] + [stages[-1]["gpus_per_trial"]],
                    where="post", color=color, label=name)
        ax_inst.step(xs, [s["instances"] for s in stages] + [stages[-1]["instances"]], where="post",
                     color=color, label=name)
        cost = [0.0]
        for s in stages:
            cost.append(cost[-1] + s["cost_usd"])
        ax_cost.plot(xs, cost, marker="o", ms=3, color=color,
                     label=f"{name}: ${predicted['cost_usd']:,.2f}, {predicted['jct_s'] / 60:,.1f} min")
    ax_cost.axvline(plan.deadline_s / 60, color="black", ls="--", lw=1, label="deadline")
    ax_gpu.set_ylabel("GPUs per trial")
    ax_inst.set_ylabel("instances")
    ax_cost.set_ylabel("compute cost (USD)")
    ax_cost.set_xlabel("time (min)")
    ax_gpu.set_title(f"{plan.problem_name or plan.experiment}: {plan.status}")
    for ax in (ax_gpu, ax_inst, ax_cost):
        ax.grid(alpha=0.3)
    ax_inst.legend(fontsize=8, loc="best")
    ax_cost.legend(fontsize=8, loc="best")
    save_png(plt, fig, path)
