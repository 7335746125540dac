"""Plots a person would rather look at than read (matplotlib, Agg backend).

Each plot is two functions: ``*_figure`` builds the figure and returns it with
a `PlotRecord` of what it drew (the points of each series, the annotations,
the title), so tests can check the picture's content; ``plot_*`` saves it.
Figures use matplotlib's constrained layout, titles are wrapped to the
figure's width, legends sit outside the axes, mathtext is off (a "$" is a
dollar), annotations are placed where they overlap neither each other nor
the axes' edges, and markers drawn on top of each other are magnified in
zoom panels. Every text stays inside the figure (tests/test_plots.py).
"""

from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from matplotlib.artist import Artist

    from thrifty.solver.tuning_plan import TuningPlan, TuningStage

__all__ = ["TUNING_PLANNERS", "LineStyle", "PlotRecord", "crowded_groups", "literal_text", "padded_limits",
           "pareto_front", "place_annotation", "plot_training_plan", "plot_tuning_plan", "pyplot", "save_png",
           "training_plan_figure", "tuning_plan_figure", "wrap_title"]

FILL_MIN_POINTS = 200  # below this many recorded candidates, the plot adds lower bounds of the rest
LOG_RATIO = 30.0       # an axis whose data span more than this factor is drawn on a log scale


class LineStyle(TypedDict, total=False):
    """Keyword arguments of a matplotlib line, shared by a line and its legend entry."""

    color: str
    lw: float
    ls: str | tuple[float, Sequence[float]]  # a named style, or (offset, on-off dash lengths)
    alpha: float


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


def literal_text(build):
    """`build` (a function that makes a figure) run with matplotlib's mathtext
    off, so that the dollars of two costs in one label ("$0.07, more than
    $0.06") are drawn as dollars, not as the ends of a formula."""

    @functools.wraps(build)
    def with_literal_text(*args, **kwargs):
        with pyplot().rc_context({"text.parse_math": False}):
            return build(*args, **kwargs)

    return with_literal_text


def save_png(plt, fig, path: str | Path) -> None:
    """Lay out `fig` (unless it has a layout engine), write it to `path` as PNG atomically, and close it."""
    import io

    from thrifty.core.io import atomic_write_bytes

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

    best: tuple[int, int, int] | None = None  # (score, dx, dy)
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
    assert best is not None  # the ring has offsets
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

NEAREST_MARKERS = ["D", "P", "X", "s", "^", "v", "p", "h"]
TAGS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_ZOOMS = 3        # zoom panels under the plane, one per group of plans drawn on top of each other
CROWDED_PX = 20.0    # plans' markers (about 15 pixels wide) closer than this overlap
AXES_PX = (840.0, 340.0)  # about the main axes' size in pixels, to find crowded plans before the layout


@dataclass
class _Key:
    """A plan the plot names: the chosen plan, or a plan that a relaxation
    of an infeasible problem allows."""

    total_s: float
    cost_usd: float
    label: str   # what it is, for the legend
    text: str    # with its configuration and figures, for an annotation
    marker: str
    color: str
    ms: float
    p95_s: float | None = None


@dataclass
class _Plane:
    """Everything the time-cost plane shows, in (total_s, cost_usd)."""

    feasible: list[tuple[float, float]]
    infeasible: list[tuple[float, float]]
    bounded: list[tuple[float, float]]
    front: list[tuple[float, float]]
    time_limit: float | None
    cost_limit: float | None
    keys: list[_Key]

    def key_points(self) -> list[tuple[float, float]]:
        return [(k.total_s, k.cost_usd) for k in self.keys]

    def all_points(self) -> list[tuple[float, float]]:
        return self.feasible + self.infeasible + self.bounded + self.key_points()


def _draw_plane(ax, plane: _Plane, tags: dict[int, str]) -> None:
    """The plane's layers on `ax` (its limits already set); the keys of
    `tags` (indexes into ``plane.keys``) get their letter beside the marker."""
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
    for i, k in enumerate(plane.keys):
        if k.p95_s is not None and k.p95_s > k.total_s:
            ax.errorbar([k.total_s], [k.cost_usd], xerr=[[0], [k.p95_s - k.total_s]], fmt="none",
                        ecolor="#2f6b3a", capsize=3, zorder=5.5)
        ax.plot([k.total_s], [k.cost_usd], ls="", marker=k.marker, ms=k.ms, color=k.color, mec="black",
                zorder=6, label=f"_key{i}")
        if i in tags:
            ax.annotate(tags[i], (k.total_s, k.cost_usd), xytext=(6, 5), textcoords="offset points", fontsize=9,
                        fontweight="bold", zorder=7)


def _set_limits(ax, xs: list[float], ys: list[float], log_x: bool, log_y: bool) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for log, set_scale, axis in ((log_x, ax.set_xscale, ax.xaxis), (log_y, ax.set_yscale, ax.yaxis)):
        if log:  # 1-2-5 ticks written as plain numbers: 0.02, 0.05, 0.1 (not 10^-1 alone)
            set_scale("log")
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.6g}"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(*padded_limits(xs, log_x))
    ax.set_ylim(*padded_limits(ys, log_y))


def crowded_groups(points: list[tuple[float, float]], xlim: tuple[float, float], ylim: tuple[float, float],
                   log_x: bool = False, log_y: bool = False, size_px: tuple[float, float] = AXES_PX,
                   min_px: float = CROWDED_PX) -> list[list[int]]:
    """Groups of `points` (indexes, largest group first) that an axes of
    `size_px` pixels over `xlim` x `ylim` draws within `min_px` of one another,
    linked in chains; points apart from all others are in no group."""
    def share(v: float, lim: tuple[float, float], log: bool) -> float:
        f = math.log10 if log else float
        return (f(v) - f(lim[0])) / (f(lim[1]) - f(lim[0]))

    px = [(share(x, xlim, log_x) * size_px[0], share(y, ylim, log_y) * size_px[1]) for x, y in points]
    parent = list(range(len(px)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i in range(len(px)):
        for j in range(i + 1, len(px)):
            if math.dist(px[i], px[j]) < min_px:
                parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(px)):
        groups.setdefault(root(i), []).append(i)
    return sorted((g for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g[0]))


def _zoom_limits(vals: list[float], limit: float | None) -> tuple[float, float]:
    """A zoom panel's range around `vals`, with `limit` when it is near."""
    span = max(vals) - min(vals) or abs(vals[0]) * 0.01 or 1.0
    if limit is not None and abs(limit - (max(vals) + min(vals)) / 2) < 4 * span:
        vals = vals + [limit]
    lo, hi = min(vals), max(vals)
    half = max((hi - lo) * 0.5 * 1.5, span)
    return (lo + hi) / 2 - half, (lo + hi) / 2 + half


def _zoom_panel(ax, zax, plane: _Plane, group: list[int], number: int, tags: dict[int, str]) -> None:
    """`zax` magnifies the keys of `group`, drawn on top of each other on
    `ax`, where a numbered box shows the region magnified."""
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import MaxNLocator

    x0, x1 = _zoom_limits([plane.keys[i].total_s for i in group], plane.time_limit)
    y0, y1 = _zoom_limits([plane.keys[i].cost_usd for i in group], plane.cost_limit)
    zax.set_xlim(x0, x1)
    zax.set_ylim(y0, y1)
    _draw_plane(zax, plane, {i: tags[i] for i in group})
    zax.xaxis.set_major_locator(MaxNLocator(3))
    zax.yaxis.set_major_locator(MaxNLocator(4))
    zax.tick_params(labelsize=7)
    zax.set_xlabel("time (s)", fontsize=7)
    zax.set_ylabel("cost (USD)", fontsize=7)
    zax.grid(alpha=0.3)
    zax.set_title(f"zoom {number}: " + ", ".join(tags[i] for i in group), fontsize=8)
    ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ec="#444444", lw=0.9, zorder=7))
    ax.annotate(str(number), (x1, y1), xytext=(3, 3), textcoords="offset points", fontsize=8,
                fontweight="bold", color="#444444", zorder=7)


def _keys(plan, plane_plan: tuple[float, float, float] | None) -> list[_Key]:
    keys = []
    if plane_plan is not None:
        t, c, p95 = plane_plan
        keys.append(_Key(t, c, f"plan ({plan.status}), bar to its p95 time",
                         f"plan {plan.config}\n{t:,.1f} s (p95 {p95:,.1f} s), ${c:,.4f}", "*", "#55a868", 18, p95))
    for i, n in enumerate(_nearest_feasible(plan) if not plan.feasible else []):
        keys.append(_Key(n["total_s"], n["cost_usd"], n["label"],
                         f"{n['label']}:\n{n['config']}\n{n['total_s']:,.1f} s, ${n['cost_usd']:,.4f}",
                         NEAREST_MARKERS[i % len(NEAREST_MARKERS)], "#dd8452", 9))
    return keys


def _nearest_feasible(plan) -> list[dict[str, Any]]:
    """For an infeasible plan, the plans its relaxations allow, ``{label,
    config, total_s, cost_usd}``, from the relaxations that carry them
    (``total_s`` and ``cost_usd``); a plan that several allow is listed once."""
    merged: dict[str, dict[str, Any]] = {}
    for r in plan.infeasibility.relaxations:
        if r.get("total_s") is None or r.get("cost_usd") is None:
            continue
        label = r.get("note") or _relaxation_label(r)
        config = r["plan"] if isinstance(r.get("plan"), str) else label
        if config in merged:
            merged[config]["label"] += "; " + label
        else:
            merged[config] = {"label": label, "config": config, "total_s": float(r["total_s"]),
                              "cost_usd": float(r["cost_usd"])}
    return list(merged.values())


def _relaxation_label(r: dict[str, Any]) -> str:
    """A relaxation in a few words: "with instances[0].quota 4 → 7 and limits.cost_usd 1.3 → 2.53439"."""
    if "field" in r:
        changes = {r["field"]: (r.get("current"), r.get("needed"))}
    else:
        current, needed = r.get("current"), r.get("needed")
        current = current if isinstance(current, dict) else {}
        needed = needed if isinstance(needed, dict) else {}
        changes = {f: (current.get(f), needed.get(f)) for f in r.get("fields", [])}
    return "with " + " and ".join(f"{f} {_fmt_value(now)} \u2192 {_fmt_value(new)}" if now is not None else
                        f"{f} {_fmt_value(new)}" for f, (now, new) in changes.items())


def _fmt_value(value: Any) -> str:
    return f"{value:,.6g}" if isinstance(value, float) else str(value)


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
    # the front of everything drawn: a bound is never above its candidate's simulated figures, so
    # no candidate of the drawn ones is both faster and cheaper than this staircase
    return _Plane(ok, bad, bounded, pareto_front(ok + bad + bounded), limits.time_s, limits.cost_usd,
                  _keys(plan, (p.total_s, p.cost_usd, p.total_s_p95) if p else None))


def _subtitle(space, plan) -> str:
    sim = plan.solver.candidates_simulated
    size = int(space.size)
    head = f"{plan.status} ({plan.solver.method}): "
    exhaustive_proof = plan.solver.method == "exhaustive" and (
        plan.status == "optimal" or (not plan.feasible and plan.solver.details.get("proven", False)))
    if not exhaustive_proof or sim >= size:
        return head + f"{sim:,} of {size:,} candidates simulated"
    if sim == 0:
        return head + f"none of the {size:,} candidates simulated: every lower bound already breaks a limit"
    others = "the others' lower bounds " + ("cannot beat the plan" if plan.feasible else "already break a limit")
    return head + f"{sim:,} of {size:,} candidates simulated; {others}"


def _tagged_label(tag: str, key: _Key, width: int = 64) -> str:
    """A key's legend entry: its tag and what it is, then its configuration
    and figures on lines of their own, indented under the tag."""
    lines = textwrap.wrap(f"{tag}: " + key.text.replace("\n", ", "), width, subsequent_indent="    ",
                          break_on_hyphens=False)
    if len(lines) > 1:  # break where the text does, not inside a configuration or a figure
        lines = textwrap.wrap(f"{tag}: " + key.text.split("\n")[0], width, subsequent_indent="    ")
        lines += ["    " + part for part in key.text.split("\n")[1:]]
    return "\n".join(lines)


def _plane_handles(plane: _Plane, key_labels: list[str]) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Artist] = []
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
                              label=f"Pareto front of the candidates ({len(plane.front)})"))
    for k, label in zip(plane.keys, key_labels):
        handles.append(Line2D([], [], ls="", marker=k.marker, ms=min(k.ms, 11), color=k.color, mec="black",
                              label=label))
    return handles


def _training_layout(zooms: int, handles: list):
    """The figure, its plane's axes and `zooms` zoom panels under it; taller
    for a long legend (two columns, in order: the left one holds the first half)."""
    plt = pyplot()
    lines = [h.get_label().count("\n") + 1 for h in handles]
    half = -(-len(lines) // 2)
    legend_lines = max(sum(lines[:half]), sum(lines[half:]))
    height = 6.2 + (2.4 if zooms else 0.0) + 0.15 * max(0, legend_lines - 6)
    fig = plt.figure(figsize=(8, height), dpi=120, layout="constrained")
    if not zooms:
        return fig, fig.add_subplot(), []
    grid = fig.add_gridspec(2, zooms, height_ratios=[2.3, 1])
    return fig, fig.add_subplot(grid[0, :]), [fig.add_subplot(grid[1, k]) for k in range(zooms)]


@literal_text
def training_plan_figure(space, plan):
    """The time-cost plane of the candidates the search simulated (filled) or
    ruled out by a lower bound (hollow, at the bound), their Pareto front, the
    limits with the region within them shaded, the plan, and for an
    infeasible problem the plans its relaxations allow. Plans drawn on top of
    one another are magnified in zoom panels under the plane and tagged A, B,
    ... (the legend says what each is); else each has a box with its
    figures. Returns (figure, record)."""
    import numpy as np

    plane = _plane(space, plan)
    rec = PlotRecord()
    pts = plane.all_points() + [(k.p95_s, k.cost_usd) for k in plane.keys if k.p95_s is not None]
    xs = [x for x, _ in pts] + [v for v in (plane.time_limit,) if v is not None]
    ys = [y for _, y in pts] + [v for v in (plane.cost_limit,) if v is not None]
    xs, ys = xs or [1.0], ys or [1.0]
    log_x, log_y = use_log(xs), use_log(ys)
    groups = crowded_groups(plane.key_points(), padded_limits(xs, log_x), padded_limits(ys, log_y),
                            log_x, log_y)[:MAX_ZOOMS]
    tagged = bool(groups) or len(plane.keys) > 3  # boxes of text for more would cover the plane
    tags = {i: TAGS[i % len(TAGS)] for i in range(len(plane.keys))} if tagged else {}
    key_labels = [_tagged_label(tags[i], k) if tagged else k.label for i, k in enumerate(plane.keys)]
    handles = _plane_handles(plane, key_labels)
    fig, ax, zoom_axes = _training_layout(len(groups), handles)
    _set_limits(ax, xs, ys, log_x, log_y)
    in_zoom = {i for g in groups for i in g}
    _draw_plane(ax, plane, {i: t for i, t in tags.items() if i not in in_zoom})
    for number, (group, zax) in enumerate(zip(groups, zoom_axes), start=1):
        _zoom_panel(ax, zax, plane, group, number, tags)

    name = space.problem.name or space.problem.model
    title, subtitle = wrap_title(name, 8, 12), wrap_title(_subtitle(space, plan), 8, 9)
    fig.suptitle(title, fontsize=12)
    ax.set_title(subtitle, fontsize=9)
    ax.set_xlabel("predicted total time (s)" + (", log scale" if log_x else ""))
    ax.set_ylabel("predicted cost (USD)" + (", log scale" if log_y else ""))
    ax.grid(alpha=0.3, which="both" if (log_x or log_y) else "major")
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    rec.title = title + "\n" + subtitle
    rec.scales = {"x": "log" if log_x else "linear", "y": "log" if log_y else "linear"}
    rec.series = {"simulated_feasible": plane.feasible, "simulated_infeasible": plane.infeasible,
                  "bounded": plane.bounded, "pareto": plane.front}
    if plan.feasible:
        rec.series["plan"] = plane.key_points()[:1]
    else:
        rec.series["nearest_feasible"] = plane.key_points()
    rec.notes.update(handles=[h.get_label() for h in handles], zoom_groups=[[tags[i] for i in g] for g in groups],
                     tags=[tags.get(i) for i in range(len(plane.keys))])
    if tagged:
        rec.annotations = key_labels
        return fig, rec
    fig.canvas.draw()  # the boxes are placed against the final layout, and kept out of it
    placed: list = []
    avoid = ax.transData.transform(np.asarray(plane.all_points()))
    keys = ax.transData.transform(np.asarray(plane.key_points())) if plane.keys else ()
    for k in plane.keys:
        place_annotation(ax, (k.total_s, k.cost_usd), k.text, placed, avoid, keys)
        rec.annotations.append(k.text)
    return fig, rec


def plot_training_plan(space, plan, path: str | Path) -> PlotRecord:
    """`training_plan_figure` saved to `path` as PNG; returns what it drew."""
    fig, rec = training_plan_figure(space, plan)
    save_png(pyplot(), fig, path)
    return rec


# -- tuning plans ----------------------------------------------------------------------

# drawn in this order: the widest line first, so narrower ones stay visible on top
_TUNING_STYLES: dict[str, LineStyle] = {
    "thrifty": {"color": "#55a868", "lw": 4.0, "ls": "-", "alpha": 0.75},
    "static": {"color": "#c44e52", "lw": 2.0, "ls": ":"},
    "naive elastic": {"color": "#dd8452", "lw": 1.6, "ls": "-."},
    "greedy": {"color": "#4c72b0", "lw": 1.4, "ls": "--"},
    "exact": {"color": "#8172b2", "lw": 2.0, "ls": "-"},
}
TUNING_PLANNERS = ("static", "naive elastic", "greedy", "exact")  # every planner `plan_tuning` runs


@dataclass
class _TuningRun:
    """One planner's line: its style key, legend label and stages (none when it has no plan)."""

    key: str
    label: str
    stages: list[TuningStage]
    cost_usd: float | None = None  # the predicted total, with what no stage is charged


def _tuning_runs(plan: TuningPlan, unit: str) -> list[_TuningRun]:
    """The answer (named after the planner it came from) and every baseline;
    the exact planner's plan when it is not the answer (its model figures,
    or for an infeasible problem the fastest plan, with the deadline it needs).
    Times in the labels are in `unit` ("s" or "min")."""
    solver = plan.solver
    chosen = solver.chosen if solver is not None and solver.chosen is not None else "exact"
    runs = []
    if plan.stages and plan.predicted is not None:
        ours = plan.predicted
        runs.append(_TuningRun("thrifty", f"thrifty = {chosen}: {_duration(ours.jct_s, unit)}, "
                                          f"{_usd(ours.cost_usd)}", plan.stages, ours.cost_usd))
    for key, name in (("static", "static"), ("naive_elastic", "naive elastic"), ("greedy", "greedy")):
        b = plan.baselines.get(key)
        p = b.predicted if b is not None else None
        label = f"{name}: {_duration(p.jct_s, unit)}, {_usd(p.cost_usd)}" if p else \
            f"{name}: no plan meets the deadline"
        runs.append(_TuningRun(name, label, b.stages if b is not None else [], p.cost_usd if p else None))
    if plan.feasible and chosen == "exact":
        return runs
    fastest = [(r, stages) for r in _relaxations(plan) if (stages := _relaxation_stages(r))]
    if fastest:
        r, stages = fastest[0]
        jct = r.get("total_s", _end_s(stages[-1]))
        cost = r.get("cost_usd", sum(s.cost_usd or 0.0 for s in stages))
        runs.append(_TuningRun("exact", f"exact, the fastest plan (needs {r.get('field', 'deadline_s')} >= "
                                        f"{r['needed']:,.0f} s): {_duration(jct, unit)}, {_usd(cost)}", stages,
                               r.get("cost_usd")))
    elif solver is not None and solver.exact_model_cost_usd is not None:
        runs.append(_TuningRun("exact", f"exact, not chosen (not drawn): its model predicted "
                                        f"{_duration(solver.exact_model_jct_s or 0.0, unit)}, "
                                        f"{_usd(solver.exact_model_cost_usd)}", []))
    else:
        runs.append(_TuningRun("exact", "exact: no plan meets the deadline", []))
    return runs


def _relaxations(plan: TuningPlan) -> list[dict[str, Any]]:
    return plan.infeasibility.relaxations if plan.infeasibility is not None else []


def _relaxation_stages(relaxation: dict[str, Any]) -> list[TuningStage] | None:
    """The stages of the plan a relaxation of a tuning problem allows, if it
    carries them with their times (JSON objects, or `TuningStage`s)."""
    from pydantic import TypeAdapter, ValidationError

    from thrifty.solver.tuning_plan import TuningStage

    for key in ("stages", "plan"):
        given = relaxation.get(key)
        if not (isinstance(given, list) and given):
            continue
        try:
            stages = TypeAdapter(list[TuningStage]).validate_python(given)
        except ValidationError:
            continue  # not a list of stages (a training relaxation's plan is its configuration)
        if stages[0].start_s is not None:
            return stages
    return None


def _end_s(stage: TuningStage) -> float:
    """A drawn stage's end (the planners write it; `_relaxation_stages` and the plan's own stages carry it)."""
    return stage.end_s if stage.end_s is not None else 0.0


def _duration(seconds: float, unit: str) -> str:
    return f"{seconds / 60:,.1f} min" if unit == "min" else f"{seconds:,.1f} s"


def _usd(value: float) -> str:
    return f"${value:,.2f}" if value >= 1 else f"${value:,.4f}"


def _tuning_unit(plan: TuningPlan) -> str:
    """Minutes for a job whose plans or deadline pass 5 minutes, else seconds."""
    ends = [plan.deadline_s] + [_end_s(s) for s in plan.stages]
    ends += [_end_s(s) for b in plan.baselines.values() for s in b.stages]
    ends += [_end_s(s) for r in _relaxations(plan) for s in _relaxation_stages(r) or []]
    return "min" if max(ends) > 300 else "s"


def _cumulative_cost(stages: list[TuningStage], total_usd: float | None) -> list[float]:
    """The cost at each stage boundary; a last value, at the end, when the
    predicted total adds what no stage is charged (billing minimums, data)."""
    cost = [0.0]
    for s in stages:
        cost.append(cost[-1] + (s.cost_usd or 0.0))
    if total_usd is not None and total_usd - cost[-1] > 1e-3 * max(total_usd, 1e-9):
        cost.append(total_usd)
    return cost


@literal_text
def tuning_plan_figure(plan: TuningPlan):
    """A tuning plan over time, with every baseline: GPUs per trial and
    instances per stage, and the cumulative cost; the deadline on each panel.
    Returns (figure, record: a series per planner, empty when it has no plan
    to draw; ``notes["yticks"]``, the tick values of the two count axes)."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    fig, (ax_gpu, ax_inst, ax_cost) = plt.subplots(3, 1, figsize=(8, 8.5), dpi=120, sharex=True,
                                                   layout="constrained")
    rec = PlotRecord()
    handles = []
    unstaged = False
    unit = _tuning_unit(plan)
    per = 60.0 if unit == "min" else 1.0
    for run in _tuning_runs(plan, unit):
        style = _TUNING_STYLES[run.key]
        rec.series[run.key] = []
        if not run.stages:
            handles.append(Line2D([], [], color=style["color"], ls=style["ls"], lw=1.5, label=run.label))
            continue
        stages = run.stages
        xs = [(s.start_s or 0.0) / per for s in stages] + [_end_s(stages[-1]) / per]
        ax_gpu.step(xs, [s.gpus_per_trial for s in stages] + [stages[-1].gpus_per_trial], where="post",
                    **style)
        ax_inst.step(xs, [s.instances for s in stages] + [stages[-1].instances], where="post", **style)
        cost = _cumulative_cost(stages, run.cost_usd)
        cost_xs = xs + [xs[-1]] * (len(cost) - len(xs))
        unstaged |= len(cost) > len(xs)
        ax_cost.plot(cost_xs, cost, marker="o", ms=3.5, **style)
        handles.append(Line2D([], [], **style, label=run.label))
        rec.series[run.key] = list(zip(cost_xs, cost))
    deadline = plan.deadline_s / per
    for ax in (ax_gpu, ax_inst, ax_cost):
        ax.axvline(deadline, color="black", ls="--", lw=1)
        ax.grid(alpha=0.3)
    deadline_label = f"deadline {plan.deadline_s:,.1f}".removesuffix(".0") + " s"
    handles.append(Line2D([], [], color="black", ls="--", lw=1, label=deadline_label))
    if unstaged:
        handles.append(Line2D([], [], ls="", label="a step up at a run's end: billing minimums and data,\n"
                                                   "charged to no stage"))
    for ax in (ax_gpu, ax_inst):
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 4, 5, 10]))  # GPUs come in 2^k
        lo, hi = ax.get_ylim()
        ax.set_ylim(min(0, lo), hi + 0.5)
    ax_cost.set_ylim(bottom=0)
    ax_gpu.set_ylabel("GPUs per trial")
    ax_inst.set_ylabel("instances")
    ax_cost.set_ylabel("cumulative cost (USD)")
    ax_cost.set_xlabel(f"time since the job started ({unit})")
    name = plan.problem_name or "tuning plan"
    if plan.feasible:
        solver = plan.solver
        status = f"{plan.status} ({(solver.note or solver.chosen or '') if solver is not None else ''})"
    else:
        status = f"infeasible: {plan.infeasibility.reason if plan.infeasibility else 'no plan meets the deadline'}"
    title = f"{name}: {plan.experiment}, {plan.billing.replace('_', '-')} billing\n{status}"
    rec.title = wrap_title(title, 8, 12)
    fig.suptitle(rec.title, fontsize=12)
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    rec.notes["handles"] = [h.get_label() for h in handles]
    fig.canvas.draw()
    rec.notes["yticks"] = {name: [float(v) for v in ax.get_yticks() if ax.get_ylim()[0] <= v <= ax.get_ylim()[1]]
                           for name, ax in (("gpus_per_trial", ax_gpu), ("instances", ax_inst))}
    return fig, rec


def plot_tuning_plan(plan: TuningPlan, path: str | Path) -> PlotRecord:
    """`tuning_plan_figure` saved to `path` as PNG; returns what it drew."""
    fig, rec = tuning_plan_figure(plan)
    save_png(pyplot(), fig, path)
    return rec
