"""What the plots draw, checked on the figures themselves: the training
plan's time-cost plane (its Pareto front, limits, plan and nearest feasible
plans, on an axis wide enough to read), every planner of a tuning plan with
integer ticks on its count axes, a run's event lines apart when they fall at
one time, and no text outside the figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.lines import Line2D
from matplotlib.text import Text

from thrifty.runtime.cli import main
from thrifty.runtime.plots import (TUNING_PLANNERS, crowded_groups, pareto_front, plot_training_plan, pyplot,
                                   training_plan_figure, tuning_plan_figure)
from thrifty.runtime.training.report import run_figure
from thrifty.solver.problem import load_problem
from thrifty.solver.search import search_trace
from thrifty.solver.solve import solve
from thrifty.solver.training import TrainingSpace
from thrifty.solver.tuning_plan import TuningPlan

EXAMPLES = Path(__file__).resolve().parents[1] / "datasets" / "examples"


def solved(name: str):
    problem = load_problem(EXAMPLES / name)
    space = TrainingSpace(problem)
    return space, solve(problem, space=space)


@pytest.fixture(scope="module")
def feasible():
    return solved("srifty-case5-bert.json")  # 1 of 168 candidates simulated: the rest are lower bounds


@pytest.fixture(scope="module")
def infeasible():
    return solved("srifty-case6-inception.json")


@pytest.fixture
def closing():
    figures = []
    yield figures.append
    plt = pyplot()
    for fig in figures:
        plt.close(fig)


def texts_outside(fig) -> list[str]:
    """The texts drawn (titles, axis labels, legend, annotations, and the
    tick labels of the ticks in view) whose rendered box leaves the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox

    def outside(bb) -> bool:
        return bb is not None and (bb.x0 < box.x0 - 1 or bb.x1 > box.x1 + 1 or bb.y0 < box.y0 - 1 or bb.y1 > box.y1 + 1)

    ticks = {id(t) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
             for tick in axis.get_major_ticks() + axis.get_minor_ticks() for t in (tick.label1, tick.label2)}
    out = [t.get_text() for t in fig.findobj(Text)
           if id(t) not in ticks and t.get_visible() and t.get_text().strip()
           and outside(t.get_window_extent(renderer))]
    # the tick labels drawn are those of the ticks in view: the axis' own box holds them
    out += [f"{ax.get_label() or 'axes'} tick labels" for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
            if axis.get_visible() and outside(axis.get_tightbbox(renderer))]
    return out


def dominates(a, b) -> bool:
    return a[0] <= b[0] and a[1] <= b[1] and a != b


# -- helpers --------------------------------------------------------------------------

def test_pareto_front_by_hand():
    points = [(1, 9), (2, 4), (3, 5), (4, 4), (5, 1), (2, 4), (6, 0.5), (7, 3)]
    assert pareto_front(points) == [(1, 9), (2, 4), (5, 1), (6, 0.5)]


# -- training plans -------------------------------------------------------------------

def test_training_front_is_the_non_dominated_set_of_what_was_drawn(feasible, closing):
    space, plan = feasible
    fig, rec = training_plan_figure(space, plan)
    closing(fig)
    drawn = rec.series["simulated_feasible"] + rec.series["simulated_infeasible"] + rec.series["bounded"]
    front = rec.series["pareto"]
    assert len(rec.series["bounded"]) > 100  # the candidates the search only bounded are drawn
    assert len(front) >= 2
    assert all(p in drawn for p in front)
    assert not any(dominates(q, p) for p in front for q in drawn)  # nothing beats a front point
    assert all(any(f == p or dominates(f, p) for f in front) for p in drawn)  # the front beats the rest


def test_search_trace_holds_unsimulated_candidates_at_true_lower_bounds():
    problem = load_problem(EXAMPLES / "local-demo-srifty54.json")
    space = TrainingSpace(problem)
    plan = solve(problem, space=space, method="exhaustive")
    trace = search_trace(space)
    simulated = {e.candidate for e in space.history}
    assert plan.solver.candidates_simulated < space.size
    assert trace.bounded and trace.bounded_total == len(trace.bounded)
    assert not simulated & {cand for cand, _ in trace.bounded}
    assert len(simulated) + trace.bounded_total <= space.size  # branches cut whole are not listed
    for cand, bound in trace.bounded[:: max(1, len(trace.bounded) // 25)]:
        ev = space.evaluate(cand)
        assert bound <= ev.iteration_s * (1 + 1e-9)
        total = space.launch_s + space.iterations * bound
        assert space.cost(cand, total) <= ev.cost_usd * (1 + 1e-9)


def test_training_axes_show_the_plan_and_its_neighbours_on_a_readable_range(feasible, closing):
    space, plan = feasible
    fig, rec = training_plan_figure(space, plan)
    closing(fig)
    ax = fig.axes[0]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    xs = [x for x, _ in rec.series["bounded"] + rec.series["plan"]]
    ys = [y for _, y in rec.series["bounded"] + rec.series["plan"]]
    assert x0 <= min(xs) and max(xs) <= x1 and y0 <= min(ys) and max(ys) <= y1
    assert (x1 - x0) / x1 > 0.1 and (y1 - y0) / y1 > 0.1  # not a needle-thin axis around one point
    assert rec.series["plan"] == [(plan.predicted.total_s, plan.predicted.cost_usd)]
    # the bounds are hollow circles, the simulated filled: distinct at a glance
    hollow = [c for c in ax.collections if len(c.get_offsets()) == len(rec.series["bounded"])]
    assert hollow and hollow[0].get_facecolors().size == 0


def test_a_lone_point_gets_an_axis_of_at_least_a_tenth_of_its_value(closing):
    problem = load_problem(EXAMPLES / "srifty-case1-resnet50.json")
    space = TrainingSpace(problem.model_copy(update={"instances": problem.instances[:1]}))
    plan = solve(problem.model_copy(update={"instances": problem.instances[:1]}), space=space)
    fig, _ = training_plan_figure(space, plan)
    closing(fig)
    x0, x1 = fig.axes[0].get_xlim()
    assert x1 - x0 >= 0.1 * plan.predicted.total_s


def test_infeasible_plane_shows_the_limits_and_the_nearest_feasible_plans(infeasible, closing):
    space, plan = infeasible
    fig, rec = training_plan_figure(space, plan)
    closing(fig)
    ax = fig.axes[0]
    limits = space.problem.limits
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    assert x0 < limits.time_s < x1 and y0 < limits.cost_usd < y1
    verticals = [ln.get_xdata()[0] for ln in ax.lines if len(set(ln.get_xdata())) == 1]
    horizontals = [ln.get_ydata()[0] for ln in ax.lines if len(set(ln.get_ydata())) == 1]
    assert limits.time_s in verticals and limits.cost_usd in horizontals
    relaxed = {(r["total_s"], r["cost_usd"]) for r in plan.infeasibility.relaxations if "total_s" in r}
    assert relaxed and relaxed == set(rec.series["nearest_feasible"])
    for x, y in relaxed:
        assert x0 < x < x1 and y0 < y < y1
    legend = " ".join(rec.notes["handles"])
    assert all(r["plan"] in legend for r in plan.infeasibility.relaxations if "plan" in r)


def pixel_gaps(ax, points) -> dict[tuple[int, int], float]:
    d = ax.transData.transform(np.asarray(points))
    return {(i, j): float(np.hypot(*(d[i] - d[j]))) for i in range(len(d)) for j in range(i + 1, len(d))}


def test_plans_drawn_on_one_spot_are_magnified_apart(infeasible, closing):
    space, plan = infeasible
    fig, rec = training_plan_figure(space, plan)
    closing(fig)
    fig.canvas.draw()
    ax, *zooms = fig.axes
    keys = rec.series["nearest_feasible"]
    tags = rec.notes["tags"]
    crowded = {pair for pair, gap in pixel_gaps(ax, keys).items() if gap < 16}  # markers about 15 px wide
    assert crowded  # case 6: two pairs of plans on top of each other in the plane...
    assert len(zooms) == len(rec.notes["zoom_groups"]) >= 1
    for i, j in crowded:  # ...each pair in a zoom panel, where the two are apart
        (zax, group), = [(z, g) for z, g in zip(zooms, rec.notes["zoom_groups"]) if tags[i] in g]
        assert tags[j] in group
        assert pixel_gaps(zax, [keys[i], keys[j]])[0, 1] > 40
        x0, x1 = zax.get_xlim()
        y0, y1 = zax.get_ylim()
        assert all(x0 < x < x1 and y0 < y < y1 for x, y in (keys[i], keys[j]))
    named = [label for label in rec.notes["handles"] if label[:2] in {f"{t}:" for t in tags}]
    assert len(named) == len(keys)  # the legend says what each tag is


def test_crowded_groups_link_chains_and_leave_lone_points_out():
    points = [(0.0, 0.0), (1.0, 0.0), (2.0, 0.0), (50.0, 50.0), (90.0, 90.0), (90.5, 90.0)]
    groups = crowded_groups(points, (0, 100), (0, 100), size_px=(100, 100), min_px=1.5)
    assert groups == [[0, 1, 2], [4, 5]]
    assert crowded_groups(points, (0, 100), (0, 100), size_px=(100, 100), min_px=0.4) == []


@pytest.mark.parametrize("which", ["feasible", "infeasible"])
def test_training_texts_fit_in_the_figure(which, request, closing):
    space, plan = request.getfixturevalue(which)
    long_name = "a problem whose name is far longer than one line of the figure can hold, " * 3
    space = space.derive(name=long_name)
    fig, rec = training_plan_figure(space, plan)
    closing(fig)
    assert texts_outside(fig) == []
    assert len(rec.title.splitlines()) >= 3  # wrapped, not cut


def test_cli_plot_writes_a_png(tmp_path):
    out = tmp_path / "plan.png"
    assert main(["solve", str(EXAMPLES / "srifty-case6-inception.json"), "--plot", str(out)]) == 3
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_training_plan_returns_what_it_saved(feasible, tmp_path):
    space, plan = feasible
    rec = plot_training_plan(space, plan, tmp_path / "p.png")
    assert rec.series["plan"] and (tmp_path / "p.png").stat().st_size > 10_000


# -- tuning plans ---------------------------------------------------------------------

def stage(start, end, gpus_per_trial, instances, cost, trials=4, iters=2):
    return {"trials": trials, "iters_per_trial": iters, "gpus": instances * 4, "gpus_per_trial": gpus_per_trial,
            "instances": instances, "instance_type": "p3.8xlarge", "start_s": start, "end_s": end,
            "cost_usd": cost}


def tuning_plan(chosen="exact", **changes) -> TuningPlan:
    """A hand-made plan of a job of 10 minutes whose counts span 1..9 (where
    matplotlib's own ticks would be 2.5 and 7.5)."""
    ours = [stage(0, 200, 1, 9, 1.0), stage(200, 450, 2, 3, 0.5), stage(450, 560, 4, 1, 0.25)]
    base = {"static": [stage(0, 250, 1, 5, 1.5), stage(250, 400, 2, 5, 1.5), stage(400, 590, 5, 5, 1.5)],
            "naive_elastic": [stage(0, 150, 2, 7, 1.2), stage(150, 300, 2, 2, 0.4), stage(300, 580, 2, 1, 0.3)],
            "greedy": [stage(0, 220, 1, 8, 1.1), stage(220, 470, 2, 3, 0.55), stage(470, 595, 4, 1, 0.3)]}

    def predicted(stages, extra=0.0):
        return {"jct_s": stages[-1]["end_s"], "cost_usd": sum(s["cost_usd"] for s in stages) + extra,
                "jct_s_p95": stages[-1]["end_s"] + 10, "cost_usd_p95": 0.0}

    baselines = {k: {"status": "feasible", "stages": v, "predicted": predicted(v, extra=0.2 if k == "static" else 0)}
                 for k, v in base.items()}
    plan = TuningPlan(kind="tuning", status="optimal", stages=ours, predicted=predicted(ours), baselines=baselines,
                      solver={"method": "ilp", "chosen": chosen, "note": "exact plan, verified by simulation",
                              "exact_model_cost_usd": 1.7, "exact_model_jct_s": 560.0},
                      problem_name="hand-made", experiment="SHA(n=4)", deadline_s=600.0)
    return plan.with_changes(**changes)


def planners_named(rec) -> set[str]:
    named = set()
    for label in rec.notes["handles"]:
        for name in TUNING_PLANNERS:
            if label.startswith((f"{name}:", f"{name},", f"thrifty = {name}:")):
                named.add(name)
    return named


@pytest.mark.parametrize("chosen", ["exact", "greedy"])
def test_tuning_plot_names_every_planner(chosen, closing):
    plan = tuning_plan(chosen)
    if chosen == "greedy":  # greedy's plan is the answer: the exact plan is named, with its model's figures
        plan = plan.with_changes(stages=plan.baselines["greedy"].stages,
                                 predicted=plan.baselines["greedy"].predicted)
    fig, rec = tuning_plan_figure(plan)
    closing(fig)
    assert planners_named(rec) == set(TUNING_PLANNERS)
    for key in ("thrifty", "static", "naive elastic", "greedy"):
        assert rec.series[key], key  # drawn, not only named
    assert texts_outside(fig) == []


def test_tuning_plot_names_the_planners_without_a_plan(closing):
    plan = tuning_plan()
    nothing = {"status": "infeasible", "stages": [], "predicted": None}
    plan = plan.with_changes(status="infeasible", stages=[], predicted=None,
                             baselines={k: nothing for k in plan.baselines},
                             infeasibility={"conflicts": ["deadline_s"], "reason": "too short",
                                            "relaxations": [{"field": "deadline_s", "current": 600.0,
                                                             "needed": 700.0, "plan": plan.stages}]})
    fig, rec = tuning_plan_figure(plan)
    closing(fig)
    assert planners_named(rec) == set(TUNING_PLANNERS)
    assert [rec.series[k] for k in ("static", "naive elastic", "greedy")] == [[], [], []]
    assert rec.series["exact"]  # the fastest plan, with the deadline it needs
    assert any("deadline_s >= 700" in label for label in rec.notes["handles"])


def test_tuning_count_axes_have_integer_ticks(closing):
    fig, rec = tuning_plan_figure(tuning_plan())
    closing(fig)
    ax_gpu, ax_inst = fig.axes[0], fig.axes[1]
    for ax in (ax_gpu, ax_inst):
        lo, hi = ax.get_ylim()
        ticks = [v for v in ax.get_yticks() if lo <= v <= hi]
        assert len(ticks) >= 3
        assert all(float(v).is_integer() for v in ticks), ticks
        labels = [t.get_text().replace("\u2212", "-") for t in ax.get_yticklabels() if t.get_text()]
        assert all(label.lstrip("-").isdigit() for label in labels), labels
    assert rec.notes["yticks"]["instances"] == [v for v in ax_inst.get_yticks()
                                                if ax_inst.get_ylim()[0] <= v <= ax_inst.get_ylim()[1]]


def test_tuning_cost_ends_at_the_predicted_total(closing):
    fig, rec = tuning_plan_figure(tuning_plan())
    closing(fig)
    plan = tuning_plan()
    # static's total adds $0.20 no stage is charged: its line steps up to it at its end
    static = rec.series["static"]
    assert static[-1] == (pytest.approx(590 / 60), pytest.approx(plan.baselines["static"].predicted.cost_usd))
    assert static[-2][0] == static[-1][0] and static[-2][1] < static[-1][1]
    assert rec.series["thrifty"][-1][1] == pytest.approx(plan.predicted.cost_usd)


def test_dollars_in_labels_are_not_mathtext(closing):
    plan = tuning_plan("greedy")
    note = "the exact plan costs $1.7000 under simulation, more than greedy's $1.6500"
    plan = plan.with_changes(solver=plan.solver.with_changes(note=note))
    fig, _ = tuning_plan_figure(plan)
    closing(fig)
    assert all(not t.get_parse_math() for t in fig.findobj(Text) if "$" in t.get_text())


# -- runs -------------------------------------------------------------------------------

def run_events(preempted_at=20.0, replanned_at=20.0):
    plan = {"allocation": [{"instance_type": "local-a", "market": "spot", "count": 2, "batch_per_instance": 32}],
            "predicted": {"iteration_s": 0.04, "total_s": 29.0, "cost_usd": 0.02}}
    new = {"allocation": [{"instance_type": "local-b", "market": "spot", "count": 1, "batch_per_instance": 64}],
           "predicted": {"iteration_s": 0.05, "total_s": 20.0, "cost_usd": 0.01}}
    events = [{"event": "start", "elapsed_s": 0.0, "iterations": 600, "plan": plan,
               "limits": {"time_s": 60.0, "cost_usd": 0.05}}]
    events += [{"event": "throughput", "elapsed_s": 5.0 + t, "iterations": 20 * t, "spent_usd": 0.013}
               for t in range(15)]
    events += [{"event": "checkpoint", "elapsed_s": 19.5, "iteration": 290},
               {"event": "preemption", "elapsed_s": preempted_at, "instance_type": "local-a",
                "machine_id": "local-0", "iteration": 290},
               {"event": "replan", "elapsed_s": replanned_at, "new_config": "1xlocal-b@64", "plan": new,
                "problem": {"iterations": 310, "launch_s": 5.0, "limits": {"time_s": 40.0, "cost_usd": 0.037}}}]
    events += [{"event": "throughput", "elapsed_s": 26.0 + t, "iterations": 290 + 20 * t, "spent_usd": 0.03}
               for t in range(16)]
    events.append({"event": "finish", "elapsed_s": 41.5, "cost_usd": 0.031, "iterations": 600})
    return events


def vertical_line_xs(ax, time_limit: float = 60.0) -> list[float]:
    """The display x of each event line (vertical, spanning the axes; not the time limit's)."""
    xs = []
    for ln in ax.lines:
        x, y = ln.get_xdata(), ln.get_ydata()
        if len(x) == 2 and x[0] == x[1] != time_limit and list(y) == [0, 1]:
            xs.append(ln.get_transform().transform((x[0], 0.5))[0])
    return xs


@pytest.mark.parametrize("gap_s", [0.0, 0.004, 0.3])
def test_event_lines_at_one_time_are_apart(gap_s, closing):
    fig, rec = run_figure(run_events(20.0, 20.0 + gap_s))
    closing(fig)
    fig.canvas.draw()
    assert [kind for kind, _, _ in rec.notes["marks"]] == ["preemption", "replan"]
    for ax in fig.axes[:2]:
        xs = vertical_line_xs(ax)
        assert len(xs) == 2 and abs(xs[1] - xs[0]) >= 4  # pixels: two lines, not one over the other
    markers = [ln for ln in fig.axes[0].lines if ln.get_marker() in ("v", "D") and len(ln.get_xdata()) == 1]
    tops = [ln.get_transform().transform((ln.get_xdata()[0], 1.0)) for ln in markers]
    assert len(tops) == 2 and np.hypot(*(tops[0] - tops[1])) >= 10  # the markers do not overlap


def test_event_lines_far_apart_stay_where_they_happened(closing):
    fig, rec = run_figure(run_events(10.0, 30.0))
    closing(fig)
    assert [offset for _, _, offset in rec.notes["marks"]] == [0.0, 0.0]


def test_run_plot_texts_fit_and_markers_sit_above_the_budget(closing):
    title = "Srifty 5.4 in miniature: a tiny transformer on local pseudo machines (demo prices): run 2026-0001"
    fig, rec = run_figure(run_events(), title=title)
    closing(fig)
    assert texts_outside(fig) == []
    assert "\n" in rec.title
    ax_cost = fig.axes[1]
    assert ax_cost.get_ylim()[1] > 1.1 * 0.05  # room between the budget line and the event markers
    assert {"preemption", "re-plan", "budget $0.05", "time limit 60 s"} <= set(rec.notes["handles"])
    assert rec.series["predicted: 1xlocal-b@64"][0] == (20.0, 290)  # the re-plan's prediction starts there


def test_run_plot_has_every_event_line_on_both_panels(closing):
    fig, _ = run_figure(run_events(10.0, 30.0))
    closing(fig)
    for ax in fig.axes[:2]:
        assert len(vertical_line_xs(ax)) == 2
        assert any(isinstance(a, Line2D) and a.get_marker() == "v" for a in ax.lines)
