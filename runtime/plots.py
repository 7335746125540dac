"""Plots a person would rather look at than read (matplotlib, Agg backend).

Each plot is two functions: ``*_figure`` builds the figure and returns it with
a `PlotRecord` of what it drew (the points of each series, the annotations,
the title), so tests can check the picture's content; ``plot_*`` saves it.
Figures use matplotlib's constrained layout, titles are wrapped to the
figure's width, legends sit outside the axes, and annotations are placed
where they overlap neither each other nor the axes' edges.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PlotRecord", "plot_training_plan", "plot_tuning_plan", "training_plan_figure",
           "tuning_plan_figure", "pareto_front", "pyplot", "save_png", "wrap_title", "place_annotation",
           "padded_limits"]

FILL_MIN_POINTS = 200  # below this many recorded candidates, the plot adds lower bounds of the rest
LOG_RATIO = 30.0       # an axis whose data span more than this factor is drawn on a log scale


@dataclass
class PlotRecord:
    """What a plot drew: its series as lists of (x, y) points by name, the
    annotation texts, the title, and the scales and tick values of its axes."""

    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    annotations: list[str] = field(default_factory=list)
    title: str = ""
    scales: dict[str, str] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(plt, fig, path: str | Path) -> None:
    """Lay out `fig` (unless it has a layout engine), write it to `path` as PNG atomically, and close it."""
    import io

    from thrifty.datasets.io import atomic_write_bytes

    if fig.get_layout_engine() is None:
        fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def wrap_title(text: str, width_in: float, fontsize: float = 11.0) -> str:
    """`text` broken into lines that fit `width_in` inches at `fontsize` points
    (an average glyph is about 0.55 em wide; 0.62 leaves room for wide ones)."""
    chars = max(20, int(width_in * 72 / (fontsize * 0.62)))
    return "\n".join(textwrap.fill(part, chars) for part in text.split("\n"))


# -- small pure helpers ----------------------------------------------------------

def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats in both coordinates (lower is better),
    sorted by the first; equal points are kept once."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(set(points)):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front


def padded_limits(values: list[float], log: bool, min_rel_span: float = 0.1,
                  margin: float = 0.06) -> tuple[float, float]:
    """Axis limits around `values`: at least `min_rel_span` of their magnitude
    wide (a lone point is not drawn on a needle-thin axis), plus a margin."""
    lo, hi = min(values), max(values)
    if log:
        lo_l, hi_l = math.log10(lo), math.log10(hi)
        span = max(hi_l - lo_l, math.log10(1 + min_rel_span) * 2)
        mid = (lo_l + hi_l) / 2
        lo_l, hi_l = mid - span / 2, mid + span / 2
        pad = span * margin
        return 10 ** (lo_l - pad), 10 ** (hi_l + pad)
    magnitude = max(abs(lo), abs(hi)) or 1.0
    span = max(hi - lo, min_rel_span * magnitude)
    mid = (lo + hi) / 2
    lo, hi = mid - span * (0.5 + margin), mid + span * (0.5 + margin)
    if min(values) >= 0:  # times and costs: no negative half-axis
        lo = max(lo, 0.0)
    return lo, hi


def use_log(values: list[float]) -> bool:
    positive = [v for v in values if v > 0]
    return len(positive) == len(values) and bool(values) and max(values) / min(values) > LOG_RATIO


def place_annotation(ax, xy: tuple[float, float], text: str, placed: list, avoid=None, keep_clear=(), **kw):
    """Annotate `xy` with `text` and an arrow, at the offset where the text box
    best stays inside the axes (or at least the figure), off the boxes in
    `placed` (window extents; the new box is appended), off the display
    points `keep_clear` and over the fewest display points `avoid`."""
    import numpy as np

    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    axbox, figbox = ax.get_window_extent(renderer), fig.bbox
    px, py = ax.transData.transform(xy)
    sx = 1 if px < axbox.x0 + axbox.width / 2 else -1  # toward the middle first
    sy = 1 if py < axbox.y0 + axbox.height / 2 else -1
    ring = sorted(((sx * dx * side, sy * dy * lift) for dx in (30, 80, 140, 220) for dy in (25, 60, 110, 170)
                   for side in (1, -1) for lift in (1, -1)),
                  key=lambda o: (o[0] * sx < 0, o[1] * sy < 0, abs(o[0]) + abs(o[1])))
    avoid = np.empty((0, 2)) if avoid is None or len(avoid) == 0 else np.asarray(avoid)
    keep_clear = np.asarray(keep_clear).reshape(-1, 2)
    style = {"fontsize": 8, "zorder": 10, "textcoords": "offset points",
             "bbox": {"boxstyle": "round,pad=0.3", "fc": "white", "ec": "#888888", "alpha": 0.92},
             "arrowprops": {"arrowstyle": "->", "color": "#444444", "lw": 0.8}, **kw}

    def covers(box, pts) -> int:
        return int(((pts[:, 0] >= box.x0) & (pts[:, 0] <= box.x1) & (pts[:, 1] >= box.y0)
                    & (pts[:, 1] <= box.y1)).sum())

    def inside(box, outer) -> bool:
        return box.x0 >= outer.x0 and box.x1 <= outer.x1 and box.y0 >= outer.y0 and box.y1 <= outer.y1

    best = None
    for dx, dy in ring:
        ann = ax.annotate(text, xy, xytext=(dx, dy), ha="left" if dx > 0 else "right",
                          va="bottom" if dy > 0 else "top", **style)
        box = _text_box(ann, renderer)
        ann.remove()
        score = ((0 if inside(box, figbox) else 1_000_000) + (0 if inside(box, axbox) else 1_000)
                 + 100_000 * sum(box.overlaps(other) for other in placed)
                 + 10_000 * covers(box, keep_clear) + covers(box, avoid))
        if best is None or score < best[0]:
            best = (score, dx, dy)
        if score == 0:
            break
    _, dx, dy = best
    ann = ax.annotate(text, xy, xytext=(dx, dy), ha="left" if dx > 0 else "right",
                      va="bottom" if dy > 0 else "top", **style)
    ann.set_in_layout(False)  # placed in pixels against the current layout: the layout must not move
    placed.append(_text_box(ann, renderer))
    return ann


def _text_box(ann, renderer):
    """The window extent of an annotation's text with its box's padding, without the arrow."""
    from matplotlib.text import Text

    ann.update_positions(renderer)
    return Text.get_window_extent(ann, renderer).padded(6)


# -- training plans ------------------------------------------------------------------

@dataclass
class _Plane:
    """Everything the time-cost plane shows, in (total_s, cost_usd)."""

    feasible: list[tuple[float, float]]
    infeasible: list[tuple[float, float]]
    bounded: list[tuple[float, float]]
    front: list[tuple[float, float]]
    time_limit: float | None
    cost_limit: float | None
    plan: tuple[float, float, float] | None  # time, cost, p95 time
    nearest: list[dict[str, Any]]

    def key_points(self) -> list[tuple[float, float]]:
        pts = [(self.plan[0], self.plan[1])] if self.plan else []
        return pts + [(n["total_s"], n["cost_usd"]) for n in self.nearest]

    def all_points(self) -> list[tuple[float, float]]:
        return self.feasible + self.infeasible + self.bounded + self.key_points()


NEAREST_MARKERS = ["D", "P", "X", "s", "^", "v", "p", "h"]


def _draw_plane(ax, plane: _Plane, tags: bool = False) -> None:
    """The plane's layers on `ax` (its limits already set); with `tags`, the
    plan and the nearest plans are marked A, B, ... next to their markers."""
    from matplotlib.patches import Rectangle

    if plane.time_limit is not None or plane.cost_limit is not None:
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        right = plane.time_limit if plane.time_limit is not None else x1
        top = plane.cost_limit if plane.cost_limit is not None else y1
        if right > x0 and top > y0:
            ax.add_patch(Rectangle((x0, y0), right - x0, top - y0, fc="#55a868", alpha=0.12, ec="none", zorder=0))
        if plane.time_limit is not None:
            ax.axvline(plane.time_limit, color="#c44e52", ls="--", lw=1.2, zorder=1)
        if plane.cost_limit is not None:
            ax.axhline(plane.cost_limit, color="#dd8452", ls="--", lw=1.2, zorder=1)
    if plane.bounded:
        ax.scatter(*zip(*plane.bounded), s=22, facecolors="none", edgecolors="#7f7f7f", linewidths=0.8,
                   alpha=0.6, zorder=2)
    if plane.infeasible:
        ax.scatter(*zip(*plane.infeasible), s=20, marker="x", c="#c44e52", linewidths=1.0, zorder=3)
    if plane.feasible:
        ax.scatter(*zip(*plane.feasible), s=24, c="#4c72b0", zorder=4)
    front = plane.front
    if len(front) > 1:  # the staircase of what is reachable
        fx = [x for x, _ in front for _ in (0, 1)][1:]
        fy = [y for _, y in front for _ in (0, 1)][:-1]
        ax.plot(fx, fy, color="#8172b2", lw=1.2, zorder=3.5)
    if front:
        ax.scatter(*zip(*front), s=60, facecolors="none", edgecolors="#8172b2", linewidths=1.4, zorder=4.5)
    labels = iter("ABCDEFGHIJ")
    if plane.plan is not None:
        t, c, p95 = plane.plan
        ax.errorbar([t], [c], xerr=[[0], [max(0.0, p95 - t)]], fmt="*", ms=18, color="#55a868", mec="black",
                    ecolor="#2f6b3a", capsize=3, zorder=6)
        if tags:
            ax.annotate(next(labels), (t, c), xytext=(7, 7), textcoords="offset points", fontsize=9,
                        fontweight="bold")
    for i, n in enumerate(plane.nearest):
        ax.scatter([n["total_s"]], [n["cost_usd"]], s=80, marker=NEAREST_MARKERS[i % len(NEAREST_MARKERS)],
                   c="#dd8452", edgecolors="black", zorder=6)
        if tags:
            ax.annotate(next(labels), (n["total_s"], n["cost_usd"]), xytext=(7, 7), textcoords="offset points",
                        fontsize=9, fontweight="bold")


def _set_limits(ax, xs: list[float], ys: list[float], log_x: bool, log_y: bool, **kw) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for log, set_scale, axis in ((log_x, ax.set_xscale, ax.xaxis), (log_y, ax.set_yscale, ax.yaxis)):
        if log:  # 1-2-5 ticks written as plain numbers: 0.02, 0.05, 0.1 (not 10^-1 alone)
            set_scale("log")
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.6g}"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(*padded_limits(xs, log_x, **kw))
    ax.set_ylim(*padded_limits(ys, log_y, **kw))


def _crowded(ax, points: list[tuple[float, float]], min_px: float = 16.0) -> bool:
    """Whether two of `points` are drawn closer than `min_px` pixels on `ax`."""
    import numpy as np

    if len(points) < 2:
        return False
    d = ax.transData.transform(np.asarray(points))
    gaps = np.hypot(*(d[:, None, :] - d[None, :, :]).transpose(2, 0, 1))
    return bool((gaps[np.triu_indices(len(points), 1)] < min_px).any())


def _zoom_inset(ax, plane: _Plane, log_x: bool, log_y: bool):
    """An inset magnifying the plan and the nearest plans when they are drawn
    on top of one another, in the corner of the axes that covers the fewest
    points; None when they are apart."""
    import numpy as np

    keys = plane.key_points()
    if not _crowded(ax, keys):
        return None
    disp = ax.transAxes.inverted().transform(ax.transData.transform(np.asarray(plane.all_points())))
    kx, ky = ax.transAxes.inverted().transform(ax.transData.transform(np.asarray(keys))).mean(axis=0)
    w = h = 0.38  # corners leave room for the inset's tick labels inside the axes
    corners = [(0.59, 0.58), (0.14, 0.58), (0.59, 0.13), (0.14, 0.13)]

    def cost(corner):
        x0, y0 = corner
        under = ((disp[:, 0] >= x0) & (disp[:, 0] <= x0 + w) & (disp[:, 1] >= y0) & (disp[:, 1] <= y0 + h)).sum()
        covers_keys = x0 - 0.03 <= kx <= x0 + w + 0.03 and y0 - 0.03 <= ky <= y0 + h + 0.03
        return (1 if covers_keys else 0, int(under))

    x0, y0 = min(corners, key=cost)
    inset = ax.inset_axes([x0, y0, w, h])
    inset.set_in_layout(False)
    kxs, kys = [x for x, _ in keys], [y for _, y in keys]
    # wide enough that the key points are apart, and showing any limit nearby
    span_x = max(kxs) - min(kxs) or abs(kxs[0]) * 0.01
    span_y = max(kys) - min(kys) or abs(kys[0]) * 0.01
    lim_x = [v for v in (plane.time_limit,) if v is not None and abs(v - np.mean(kxs)) < 4 * span_x]
    lim_y = [v for v in (plane.cost_limit,) if v is not None and abs(v - np.mean(kys)) < 4 * span_y]
    for set_lim, vals, span in ((inset.set_xlim, kxs + lim_x, span_x), (inset.set_ylim, kys + lim_y, span_y)):
        lo, hi = min(vals), max(vals)
        mid, half = (lo + hi) / 2, max((hi - lo) * 0.5 * 1.7, span)
        set_lim(mid - half, mid + half)
    _draw_plane(inset, plane, tags=True)
    from matplotlib.ticker import MaxNLocator

    inset.xaxis.set_major_locator(MaxNLocator(4))
    inset.yaxis.set_major_locator(MaxNLocator(4))
    inset.tick_params(labelsize=7)
    inset.grid(alpha=0.3)
    inset.set_title("zoom", fontsize=8, pad=2)
    for artist in ax.indicate_inset_zoom(inset, edgecolor="#444444"):
        if hasattr(artist, "set_in_layout"):
            artist.set_in_layout(False)
    return inset


def _nearest_feasible(space, plan) -> list[dict[str, Any]]:
    """For an infeasible plan, the plans that each relaxation of the answer
    makes feasible, ``{label, config, total_s, cost_usd}``: the figures the
    relaxation carries (``total_s`` and ``cost_usd``, or both limits in
    ``needed``), else the plan found by searching the relaxed problem (on the
    space's simulator). When no relaxation gives a plan: the cheapest and the
    fastest plans within the quotas. The same plan is listed once."""
    out: list[dict[str, Any]] = []
    for r in plan.infeasibility.relaxations:
        needed = r.get("needed")
        what = r.get("field") or " and ".join(r.get("fields", []))
        label = r.get("note") or f"feasible with {what} {_fmt_needed(needed)}"
        if r.get("total_s") is not None and r.get("cost_usd") is not None and isinstance(r.get("plan"), str):
            out.append({"label": label, "config": r["plan"], "total_s": float(r["total_s"]),
                        "cost_usd": float(r["cost_usd"])})
        elif isinstance(needed, dict) and {"limits.time_s", "limits.cost_usd"} <= set(needed) \
                and isinstance(r.get("plan"), str):
            out.append({"label": label, "config": r["plan"], "total_s": float(needed["limits.time_s"]),
                        "cost_usd": float(needed["limits.cost_usd"])})
        else:
            best = _search_small(_relaxed(space, r))
            if best is not None:
                out.append({"label": label, "config": space.describe(best.candidate), "total_s": best.total_s,
                            "cost_usd": best.cost_usd})
    if not out:
        free = space.problem.limits.model_copy(update={"time_s": None, "cost_usd": None})
        for objective, label in (("min_cost", "the cheapest plan within the quotas"),
                                 ("min_time", "the fastest plan within the quotas")):
            best = _search_small(space.derive(objective=objective, limits=free))
            if best is not None:
                out.append({"label": label, "config": space.describe(best.candidate), "total_s": best.total_s,
                            "cost_usd": best.cost_usd})
    merged: dict[str, dict[str, Any]] = {}
    for n in out:
        if n["config"] in merged:
            merged[n["config"]]["label"] += "; " + n["label"]
        else:
            merged[n["config"]] = dict(n)
    return list(merged.values())


def _relaxed(space, relaxation: dict[str, Any]):
    """`space` with one relaxation of an infeasibility answer applied, or None
    when it names no limit or quota this knows."""
    field_name, needed = relaxation.get("field"), relaxation.get("needed")
    problem = space.problem
    if field_name in ("limits.time_s", "limits.cost_usd") and isinstance(needed, (int, float)):
        return space.derive(limits=problem.limits.model_copy(update={field_name.split(".")[1]: needed}))
    if isinstance(field_name, str) and field_name.startswith("instances[") and isinstance(needed, int):
        i = int(field_name[len("instances["):field_name.index("]")])
        instances = list(problem.instances)
        instances[i] = instances[i].model_copy(update={"quota": needed})
        return space.derive(instances=instances)
    return None


def _search_small(space):
    """The best plan of `space` by the exact search, when it is small enough to
    search while drawing (else None)."""
    if space is None or space.size == 0 or space.size > 50_000:
        return None
    from thrifty.solver.search import search_exhaustive

    return search_exhaustive(space).best


def _fmt_needed(needed: Any) -> str:
    return f"{needed:,.4g}" if isinstance(needed, float) else str(needed)


def _training_points(space) -> tuple[list, list, list]:
    """(simulated within the limits, simulated outside them, lower bounds of
    the others) as (total_s, cost_usd): the space's simulated history, the
    search's trace, and when those are few, the lower bounds of the rest of
    the pruned space (`bound_points`)."""
    from thrifty.solver.search import bound_points, search_trace

    simulated = {e.candidate: e for e in space.history}
    ok = [(e.total_s, e.cost_usd) for e in simulated.values() if e.feasible]
    bad = [(e.total_s, e.cost_usd) for e in simulated.values() if not e.feasible]
    bounded: dict = {}
    for cand, lb in search_trace(space).bounded:
        if cand not in simulated and cand not in bounded:
            total = space.launch_s + space.iterations * lb
            bounded[cand] = (total, space.cost(cand, total))
    if len(simulated) + len(bounded) < FILL_MIN_POINTS and space.size:
        for cand, total, cost in bound_points(space):
            if cand not in simulated and cand not in bounded:
                bounded[cand] = (total, cost)
    return ok, bad, list(bounded.values())


def _plane(space, plan) -> _Plane:
    ok, bad, bounded = _training_points(space)
    limits = space.problem.limits
    p = plan.predicted if plan.feasible else None
    return _Plane(ok, bad, bounded, pareto_front(ok + bad), limits.time_s, limits.cost_usd,
                  (p.total_s, p.cost_usd, p.total_s_p95) if p else None,
                  _nearest_feasible(space, plan) if not plan.feasible else [])


def _subtitle(space, plan) -> str:
    sim = plan.solver.candidates_simulated
    size = int(space.size)
    text = f"{plan.status} ({plan.solver.method}): {sim:,} of {size:,} candidates simulated"
    exhaustive_proof = plan.solver.method == "exhaustive" and (
        plan.status == "optimal" or (not plan.feasible and plan.solver.details.get("proven", False)))
    if exhaustive_proof and sim < size:
        text += ", the other lower bounds cannot beat the plan" if plan.feasible else \
            ", the other lower bounds already break a limit"
    return text


def training_plan_figure(space, plan):
    """The time-cost plane of the candidates the search simulated (filled) or
    ruled out by a lower bound (hollow, at the bound), their Pareto front, the
    limits with the region within them shaded, the plan, and for an
    infeasible problem the plans nearest to feasibility; an inset magnifies
    those when they are drawn on top of each other. Returns (figure, record)."""
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 6.2), dpi=120, layout="constrained")
    plane = _plane(space, plan)
    rec = PlotRecord()
    pts = plane.all_points()
    if plane.plan:
        pts.append((plane.plan[2], plane.plan[1]))
    xs = [x for x, _ in pts] + [v for v in (plane.time_limit,) if v is not None]
    ys = [y for _, y in pts] + [v for v in (plane.cost_limit,) if v is not None]
    if not xs or not ys:
        xs, ys = xs or [1.0], ys or [1.0]
    log_x, log_y = use_log(xs), use_log(ys)
    _set_limits(ax, xs, ys, log_x, log_y)
    rec.scales = {"x": "log" if log_x else "linear", "y": "log" if log_y else "linear"}
    _draw_plane(ax, plane)
    rec.series = {"simulated_feasible": plane.feasible, "simulated_infeasible": plane.infeasible,
                  "bounded": plane.bounded, "pareto": plane.front}
    if plane.plan:
        rec.series["plan"] = [plane.plan[:2]]
    if plane.nearest:
        rec.series["nearest_feasible"] = [(n["total_s"], n["cost_usd"]) for n in plane.nearest]

    handles = []
    if plane.time_limit is not None or plane.cost_limit is not None:
        handles.append(Patch(fc="#55a868", alpha=0.25, label="within the limits"))
    if plane.time_limit is not None:
        handles.append(Line2D([], [], color="#c44e52", ls="--", label=f"time limit {plane.time_limit:g} s"))
    if plane.cost_limit is not None:
        handles.append(Line2D([], [], color="#dd8452", ls="--", label=f"budget ${plane.cost_limit:g}"))
    if plane.bounded:
        handles.append(Line2D([], [], ls="", marker="o", mfc="none", mec="#7f7f7f",
                              label=f"not simulated, at its lower bound ({len(plane.bounded):,})"))
    if plane.infeasible:
        handles.append(Line2D([], [], ls="", marker="x", color="#c44e52",
                              label=f"simulated, outside the limits ({len(plane.infeasible):,})"))
    if plane.feasible:
        handles.append(Line2D([], [], ls="", marker="o", color="#4c72b0",
                              label=f"simulated, within the limits ({len(plane.feasible):,})"))
    if plane.front:
        handles.append(Line2D([], [], color="#8172b2", marker="o", mfc="none",
                              label=f"Pareto front of the simulated ({len(plane.front)})"))
    if plane.plan:  # the plan's and the nearest plans' handles stay last (tagged when zoomed)
        handles.append(Line2D([], [], ls="", marker="*", ms=12, color="#55a868", mec="black",
                              label=f"plan ({plan.status}), bar to its p95 time"))
    for i, n in enumerate(plane.nearest):
        handles.append(Line2D([], [], ls="", marker=NEAREST_MARKERS[i % len(NEAREST_MARKERS)], color="#dd8452",
                              mec="black", label=n["label"]))

    name = space.problem.name or space.problem.model
    fig.suptitle(wrap_title(name, 8, 12), fontsize=12)
    ax.set_title(wrap_title(_subtitle(space, plan), 8, 9), fontsize=9)
    rec.title = wrap_title(name, 8, 12) + "\n" + wrap_title(_subtitle(space, plan), 8, 9)
    ax.set_xlabel("predicted total time (s)" + (", log scale" if log_x else ""))
    ax.set_ylabel("predicted cost (USD)" + (", log scale" if log_y else ""))
    ax.grid(alpha=0.3, which="both" if (log_x or log_y) else "major")
    legend = fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    fig.canvas.draw()  # the inset and the annotations are placed against the laid-out axes
    inset = _zoom_inset(ax, plane, log_x, log_y)
    rec.notes["zoom"] = inset is not None
    texts = []
    if plane.plan:
        t, c, p95 = plane.plan
        texts.append(((t, c), f"plan {plan.config}\n{t:,.1f} s (p95 {p95:,.1f} s), ${c:,.4f}"))
    for n in plane.nearest:
        texts.append(((n["total_s"], n["cost_usd"]),
                      f"{n['label']}:\n{n['config']}\n{n['total_s']:,.1f} s, ${n['cost_usd']:,.4f}"))
    if inset is not None:
        # the inset tags the points A, B, ...; their legend entries say what they are (a box of
        # text in the axes would cover points); the inset moves with the axes when the legend grows
        key_texts = legend.get_texts()[len(handles) - len(texts):]
        for tag, label, (_, body) in zip("ABCDEFGHIJ", key_texts, texts):
            text = f"{tag}: " + body.replace(":\n", ": ", 1).replace("\n", ", ", 1)
            label.set_text(textwrap.fill(text, 60, subsequent_indent="    "))
            rec.annotations.append(text)
        fig.canvas.draw()
    else:  # the layout is final: annotations are kept out of it
        placed: list = []
        avoid = ax.transData.transform(np.asarray(plane.all_points())) if plane.all_points() else None
        keys = ax.transData.transform(np.asarray([xy for xy, _ in texts])) if texts else ()
        for xy, body in texts:
            place_annotation(ax, xy, body, placed, avoid, keys)
            rec.annotations.append(body)
    rec.notes["handles"] = [t.get_text() for t in legend.get_texts()]
    return fig, rec


def plot_training_plan(space, plan, path: str | Path) -> PlotRecord:
    """`training_plan_figure` saved to `path` as PNG; returns what it drew."""
    fig, rec = training_plan_figure(space, plan)
    save_png(pyplot(), fig, path)
    return rec


# -- tuning plans ----------------------------------------------------------------------

_TUNING_STYLES = {  # drawn in this order: the widest line first, so narrower ones stay visible on top
    "thrifty": {"color": "#55a868", "lw": 4.0, "ls": "-", "alpha": 0.75},
    "static": {"color": "#c44e52", "lw": 2.0, "ls": ":"},
    "naive elastic": {"color": "#dd8452", "lw": 1.6, "ls": "-."},
    "greedy": {"color": "#4c72b0", "lw": 1.4, "ls": "--"},
    "fastest plan": {"color": "#8172b2", "lw": 2.0, "ls": "-"},
}


def _tuning_runs(plan) -> list[tuple[str, list[dict], dict | None]]:
    runs = []
    if plan.stages:
        runs.append(("thrifty", plan.stages, plan.predicted))
    for key, name in (("static", "static"), ("naive_elastic", "naive elastic"), ("greedy", "greedy")):
        b = plan.baselines.get(key)
        if b is not None:
            runs.append((name, b.get("stages") or [], b.get("predicted")))
    if not plan.feasible and plan.infeasibility:
        for r in plan.infeasibility.get("relaxations", []):
            if r.get("plan"):
                runs.append(("fastest plan", r["plan"], {"needs": r}))
    return runs


def tuning_plan_figure(plan):
    """A tuning plan over time, with every baseline: GPUs per trial and
    instances per stage, and the cumulative cost; the deadline on each panel.
    Returns (figure, record); a planner with no plan is named in the legend."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig, (ax_gpu, ax_inst, ax_cost) = plt.subplots(3, 1, figsize=(8, 8), dpi=120, sharex=True,
                                                   layout="constrained")
    rec = PlotRecord()
    handles = []
    for name, stages, predicted in _tuning_runs(plan):
        style = _TUNING_STYLES[name]
        if not stages:
            handles.append(Line2D([], [], color=style["color"], ls=style["ls"], lw=1.5,
                                  label=f"{name}: no plan meets the deadline"))
            rec.series[name] = []
            continue
        xs = [s["start_s"] / 60 for s in stages] + [stages[-1]["end_s"] / 60]
        ax_gpu.step(xs, [s["gpus_per_trial"] for s in stages] + [stages[-1]["gpus_per_trial"]], where="post",
                    **style)
        ax_inst.step(xs, [s["instances"] for s in stages] + [stages[-1]["instances"]], where="post", **style)
        cost = [0.0]
        for s in stages:
            cost.append(cost[-1] + s["cost_usd"])
        ax_cost.plot(xs, cost, marker="o", ms=3.5, **style)
        if predicted and "needs" in predicted:
            r = predicted["needs"]
            label = f"{name} (needs {r['field']} {r['needed']:,.0f}): {xs[-1]:,.1f} min, ${cost[-1]:,.2f}"
        else:
            label = f"{name}: {predicted['jct_s'] / 60:,.1f} min, ${predicted['cost_usd']:,.2f}"
        handles.append(Line2D([], [], **style, label=label))
        rec.series[name] = list(zip(xs, cost))
    deadline = plan.deadline_s / 60
    for ax in (ax_gpu, ax_inst, ax_cost):
        ax.axvline(deadline, color="black", ls="--", lw=1)
        ax.grid(alpha=0.3)
    handles.append(Line2D([], [], color="black", ls="--", lw=1, label=f"deadline {plan.deadline_s:g} s"))
    for ax in (ax_gpu, ax_inst):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 4, 5, 10]))  # GPUs come in 2^k
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(0, lo), hi + 0.5)
    ax_gpu.set_ylabel("GPUs per trial")
    ax_inst.set_ylabel("instances")
    ax_cost.set_ylabel("cumulative cost (USD)")
    ax_cost.set_xlabel("time since the job started (min)")
    name = plan.problem_name or "tuning plan"
    if plan.feasible:
        status = f"{plan.status} ({plan.solver.get('note', plan.solver.get('chosen', ''))})"
    else:
        status = f"infeasible: {(plan.infeasibility or {}).get('reason', 'no plan meets the deadline')}"
    title = f"{name}: {plan.experiment}, {plan.billing.replace('_', '-')} billing\n{status}"
    rec.title = wrap_title(title, 8, 12)
    fig.suptitle(rec.title, fontsize=12)
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    rec.notes["handles"] = [h.get_label() for h in handles]
    fig.canvas.draw()
    rec.notes["yticks"] = {name: [float(v) for v in ax.get_yticks() if ax.get_ylim()[0] <= v <= ax.get_ylim()[1]]
                           for name, ax in (("gpus_per_trial", ax_gpu), ("instances", ax_inst))}
    return fig, rec


def plot_tuning_plan(plan, path: str | Path) -> PlotRecord:
    """`tuning_plan_figure` saved to `path` as PNG; returns what it drew."""
    fig, rec = tuning_plan_figure(plan)
    save_png(pyplot(), fig, path)
    return rec
