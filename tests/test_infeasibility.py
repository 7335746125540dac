"""Infeasibility answers are complete and tight.

A property test: hypothesis draws small training problems over the shipped
Srifty catalog and model profiles (one to three machine choices, quotas 1-4,
global batches 64-2048, time limits and budgets drawn tight) and keeps the
infeasible ones. For each answer, checked independently of the explanation's
own code (each check builds its own problem and runs an exact search):

- every conflict set is infeasible with only its members enforced (the other
  limits dropped, the other quotas unbounded) and minimal: dropping any one
  member admits a plan;
- every relaxation changes a member of every conflict set, and is re-solved:
  feasible at the stored values and at the printed ones (limits rounded up
  as `thrifty solve` prints them), infeasible 1% short of a printed limit or
  one unit short of a quota or global batch (in the direction of the
  relaxation), the others as stated; the plan it states is a plan of the
  relaxed problem, with the time and cost it states.

It counts the infeasible problems it checked and asserts at least
`MIN_INFEASIBLE` (the issue asks for 200+); ``pytest -s`` prints the counts.
Then the two cases of the issue (Srifty case 6, VGG-16 on 4 g4dn.8xlarge),
the command line's words and exit code, and a tuning deadline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from thrifty.datasets.catalog import load_catalog
from thrifty.perfmodels.library import ModelLibrary
from thrifty.runtime.cli import main
from thrifty.runtime.commands.solve import limit_text, relaxation_text
from thrifty.solver import solve
from thrifty.solver.cpsat import search_cpsat
from thrifty.solver.explain import relaxed_problem
from thrifty.solver.problem import TrainingProblem, load_problem, parse_problem
from thrifty.solver.search import search_exhaustive
from thrifty.solver.training import TrainingSpace

ROOT = Path(__file__).resolve().parents[1]
CATALOG = str(ROOT / "datasets" / "catalog" / "srifty-2022.json")
CASE6 = ROOT / "datasets" / "examples" / "srifty-case6-inception.json"
MODELS = ["resnet50", "vgg16", "alexnet", "inception-v3", "shufflenet-v2-x2.0"]
TYPES = ["p3.8xlarge", "g3.8xlarge", "g4dn.8xlarge"]
MIN_INFEASIBLE = 200
DRAWN = 400  # about 2 in 3 drawn problems are infeasible

VGG = {"kind": "training", "name": "VGG-16, global batch 4096 on at most 4 g4dn.8xlarge in 60 s",
       "model": "vgg16", "global_batch": 4096, "iterations": 20, "catalog": CATALOG,
       "instances": [{"instance_type": "g4dn.8xlarge", "market": "spot", "quota": 4}], "limits": {"time_s": 60}}

_library = ModelLibrary()
_catalog = load_catalog(CATALOG)
_simulators: dict[str, Any] = {}


def space_of(problem: TrainingProblem) -> TrainingSpace:
    """A space on the shared simulator of its model (the same answers as a fresh
    one: the simulator is deterministic; only its caches are shared)."""
    sim = _simulators.get(problem.model)
    space = TrainingSpace(problem, library=_library, catalog=_catalog, simulator=sim)
    _simulators.setdefault(problem.model, space.simulator)
    return space


def feasible(problem: TrainingProblem) -> bool:
    """An exact test: with no limit, every candidate of a non-empty space is a
    plan; else an exact search (CP-SAT, run to completion, past 200,000
    candidates, where enumerating would take minutes)."""
    space = space_of(problem)
    if space.size == 0:
        return False
    if problem.limits.time_s is None and problem.limits.cost_usd is None:
        return True
    if space.size <= 200_000:
        return search_exhaustive(space, any_feasible=True).best is not None
    found = search_cpsat(space)
    assert found.complete
    return found.best is not None


@st.composite
def problems(draw) -> TrainingProblem:
    chosen = draw(st.lists(st.tuples(st.sampled_from(TYPES), st.sampled_from(["spot", "on_demand"])),
                           min_size=1, max_size=3, unique=True))
    doc: dict[str, Any] = {
        "kind": "training", "catalog": CATALOG, "model": draw(st.sampled_from(MODELS)),
        "global_batch": draw(st.sampled_from([64, 96, 256, 512, 1000, 1024, 2048])),
        "iterations": draw(st.sampled_from([50, 200, 1000])),
        "objective": draw(st.sampled_from(["min_cost", "min_time"])),
        "instances": [{"instance_type": t, "market": m, "quota": draw(st.integers(1, 4))} for t, m in chosen],
        "overheads": {"launch_s": draw(st.sampled_from([0, 30]))},
        "respect_threshold": draw(st.sampled_from([True, True, False])),
    }
    limits = {}
    if draw(st.booleans()):
        limits["time_s"] = draw(st.floats(5, 600))
    if draw(st.booleans()) or not limits:
        limits["cost_usd"] = draw(st.floats(0.01, 3))
    doc["limits"] = limits
    return parse_problem(doc)


def _only(problem: TrainingProblem, kept: set[str]) -> TrainingProblem:
    """`problem` with only the limits and quotas in `kept` enforced (a quota of
    global_batch machines is no quota: every machine takes one sample at least)."""
    changes: dict[str, Any] = {n: None for n in ("limits.time_s", "limits.cost_usd") if n not in kept}
    changes.update({f"instances[{i}].quota": max(c.quota, problem.global_batch)
                    for i, c in enumerate(problem.instances) if f"instances[{i}].quota" not in kept})
    return relaxed_problem(problem, changes)


def check_conflict_sets(problem: TrainingProblem, sets: list[list[str]]) -> None:
    for s in sets:
        members = {n for n in s if n != "global_batch"}  # the global batch is always enforced
        assert not feasible(_only(problem, members)), f"{s} is not a conflict"
        for n in members:
            # monotone: a plan with only n dropped (a smaller space to search) meets every subset
            assert feasible(_only(problem, set(_names(problem)) - {n})) or feasible(_only(problem, members - {n})), \
                f"{s} is not minimal: without {n} it still conflicts"


def _names(problem: TrainingProblem) -> list[str]:
    limits = [f"limits.{n}" for n in ("time_s", "cost_usd") if getattr(problem.limits, n) is not None]
    return limits + [f"instances[{i}].quota" for i in range(len(problem.instances))]


def _printed(name: str, value: Any) -> Any:
    """The value as `thrifty solve` prints it (limits rounded up)."""
    return float(limit_text(value).replace(",", "")) if name.startswith("limits.") else value


def _short(name: str, value: Any, current: Any) -> Any:
    if name.startswith("limits."):
        return value * 0.99
    if name == "global_batch":
        return value + 1 if value < current else value - 1
    return value - 1


def check_relaxation(problem: TrainingProblem, sets: list[list[str]], r: dict[str, Any]) -> None:
    changes = r["changes"]
    hits = set(changes) | ({"global_batch"} if set(changes) & {"batch_sizes", "respect_threshold"} else set())
    assert all(hits & set(s) for s in sets), f"{r} leaves a conflict set untouched"
    relaxed = relaxed_problem(problem, changes)
    assert feasible(relaxed), r
    printed = {n: _printed(n, v) for n, v in changes.items()}
    assert feasible(relaxed_problem(problem, printed)), (r, printed)
    for name, value in printed.items():
        if isinstance(value, (bool, str)):
            continue
        current = r["current"][name] if isinstance(r["current"], dict) else r["current"]
        short = _short(name, value, current)
        if short == current:
            continue  # the global batch one step from the current one: the problem itself
        assert not feasible(relaxed_problem(problem, {**changes, name: short})), (r, name, short)
    # the stated plan is a plan of the relaxed problem, with the stated time and cost
    space = space_of(relaxed)
    index = {(c.itype.name, c.spec.market): c.index for c in space.choices}
    candidate = tuple(sorted((index[a["instance_type"], a["market"]], a["count"], a["batch_per_instance"])
                             for a in r["allocation"]))
    assert sum(count * batch for _, count, batch in candidate) == relaxed.global_batch
    assert all(count <= space.choices[i].quota and batch in space.choices[i].batches
               for i, count, batch in candidate), r
    ev = space.evaluate(candidate)
    assert ev.feasible, r
    assert math.isclose(ev.total_s, r["total_s"], rel_tol=1e-9) and math.isclose(ev.cost_usd, r["cost_usd"],
                                                                                  rel_tol=1e-9), r
    assert space.describe(candidate) == r["plan"]


COUNTS = {"drawn": 0, "infeasible": 0, "relaxations": 0, "joint_relaxations": 0, "conflict_sets": 0,
          "several_sets": 0, "without_relaxation": 0}


# the count is kept across two tests: both run on one xdist worker, in file order
COUNTED = pytest.mark.xdist_group("test_infeasibility-counts")


@COUNTED
@settings(max_examples=DRAWN, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(problem=problems())
def test_every_infeasible_answer_is_complete_and_tight(problem: TrainingProblem) -> None:
    COUNTS["drawn"] += 1
    plan = solve(problem, space=space_of(problem))
    if plan.feasible:
        return
    why = plan.infeasibility
    assert why.conflict_sets and why.conflict_sets_complete, why
    assert why.conflicts == [n for n in why.conflicts if any(n in s for s in why.conflict_sets)]
    assert set(why.conflicts) == {n for s in why.conflict_sets for n in s}
    assert len(why.conflict_reasons) == len(why.conflict_sets)
    check_conflict_sets(problem, why.conflict_sets)
    for r in why.relaxations:
        check_relaxation(problem, why.conflict_sets, r)
        assert relaxation_text(r)
    COUNTS["infeasible"] += 1
    COUNTS["relaxations"] += len(why.relaxations)
    COUNTS["joint_relaxations"] += sum("fields" in r for r in why.relaxations)
    COUNTS["conflict_sets"] += len(why.conflict_sets)
    COUNTS["several_sets"] += len(why.conflict_sets) > 1
    COUNTS["without_relaxation"] += not why.relaxations


@COUNTED
def test_enough_infeasible_problems_were_checked() -> None:
    """Runs after the property test (file order): its count of infeasible problems."""
    print(f"\ninfeasibility property test: {COUNTS}")
    assert COUNTS["drawn"] >= DRAWN, COUNTS
    assert COUNTS["infeasible"] >= MIN_INFEASIBLE, COUNTS
    assert COUNTS["without_relaxation"] == 0, COUNTS


# -- the cases of the issue ------------------------------------------------------------

def _explain(problem: TrainingProblem):
    plan = solve(problem, space=space_of(problem))
    assert plan.status == "infeasible"
    return plan.infeasibility


def test_case6_names_both_conflicts_and_tight_limits() -> None:
    problem = load_problem(CASE6)
    why = _explain(problem)
    assert why.conflict_sets == [["limits.cost_usd"], ["limits.time_s", "instances[0].quota",
                                                       "instances[1].quota", "instances[2].quota"]]
    fastest = next(r for r in why.relaxations if r.get("note") == "the fastest plan within the quotas")
    assert 310 < fastest["needed"]["limits.time_s"] < 320  # the fastest plan within the quotas: ~316 s
    assert any(r.get("fields") == ["instances[0].quota", "limits.cost_usd"] for r in why.relaxations)
    for r in why.relaxations:
        check_relaxation(problem, why.conflict_sets, r)


def test_vgg_batch_quota_conflict_has_quota_and_batch_relaxations() -> None:
    problem = parse_problem(VGG)
    why = _explain(problem)
    assert why.conflict_sets == [["global_batch", "instances[0].quota"]]
    by_field = {r["field"]: r for r in why.relaxations if "field" in r}
    assert by_field["instances[0].quota"]["needed"] == 32  # 4096 / 128, the largest batch of a g4dn.8xlarge
    assert by_field["global_batch"]["needed"] == 512 and by_field["global_batch"]["direction"] == "lower"
    for r in why.relaxations:
        check_relaxation(problem, why.conflict_sets, r)


def test_cli_prints_conflicts_and_consequences_and_exits_3(tmp_path: Path, capsys, monkeypatch) -> None:
    path = tmp_path / "vgg.json"
    path.write_text(json.dumps(VGG))
    monkeypatch.setenv("COLUMNS", "250")  # one line per relaxation
    assert main(["solve", str(path)]) == 3
    human = capsys.readouterr().out
    assert "conflict: global_batch, instances[0].quota (relax one of them)" in human
    assert "raise instances[0].quota from 4 to 32: then 32xg4dn.8xlarge@128 takes" in human
    assert "lower global_batch from 4096 to 512" in human
    assert main(["solve", str(path), "--json"]) == 3
    why = json.loads(capsys.readouterr().out)["infeasibility"]
    assert {"conflict_sets", "conflict_reasons", "conflict_sets_complete", "conflicts", "reason",
            "relaxations"} <= set(why)
    for r in why["relaxations"]:
        assert {"changes", "plan", "allocation", "total_s", "cost_usd"} <= set(r)


def test_printed_limits_round_up_by_less_than_a_tenth_of_a_percent() -> None:
    for value in (316.34347145583683, 1.5445447299522086, 0.012345, 99999.95, 1e-7, 5.0, 1234567.8):
        printed = float(limit_text(value).replace(",", ""))
        assert value <= printed < value * 1.001


def test_tuning_deadline_relaxation_is_tight() -> None:
    doc = json.loads((ROOT / "datasets" / "examples" / "rubberband-sha32-resnet101.json").read_text())
    doc = {**doc, "deadline_s": 300, "samples": 50}
    plan = solve(doc)
    assert plan.status == "infeasible"
    r = next(r for r in plan.infeasibility.relaxations if r["field"] == "deadline_s")
    assert {"changes", "plan", "total_s", "cost_usd"} <= set(r)
    assert solve({**doc, "deadline_s": r["needed"]}).feasible
    assert solve({**doc, "deadline_s": float(limit_text(r["needed"]).replace(",", ""))}).feasible
    assert not solve({**doc, "deadline_s": r["needed"] * 0.99}).feasible


def test_a_search_stopped_by_its_time_limit_claims_no_conflict() -> None:
    """No plan found in time is not a proof: nothing is analysed (no conflict sets, no relaxations), and the
    reason says the problem was not proven infeasible (a review found a time limit blamed for a plan the
    search had no time to find)."""
    from thrifty.solver.explain import explain_infeasibility

    space = space_of(parse_problem(VGG))
    why = explain_infeasibility(space, proven=False)
    assert why.conflict_sets == [] and why.relaxations == [] and not why.conflict_sets_complete
    assert "not proven infeasible" in why.reason


def test_an_undecided_unsat_core_is_no_conflict(monkeypatch) -> None:
    """Past the constraints MARCO enumerates, z3's core names the conflict; when z3 cannot decide in its
    time either, no conflict is known, and none is claimed (before, the limits were named)."""
    import thrifty.solver.explain as explain
    import thrifty.solver.smt as smt

    monkeypatch.setattr(smt, "unsat_core", lambda space, deadline_s: None)
    types = ["g4dn.xlarge", "g4dn.2xlarge", "g4dn.4xlarge", "g4dn.8xlarge", "g4dn.12xlarge", "p3.2xlarge"]
    choices = [{"instance_type": t, "market": m, "quota": 1} for t in types for m in ("spot", "on_demand")]
    assert len(choices) + 1 > explain.MUS_MAX_CONSTRAINTS
    plan = solve({"kind": "training", "model": "resnet50", "global_batch": 256, "iterations": 1000,
                  "instances": choices, "limits": {"time_s": 1}})
    assert plan.status == "infeasible" and plan.solver.details["proven"] and plan.infeasibility.conflict_sets == []
    assert not plan.infeasibility.conflict_sets_complete


def test_a_cpsat_search_stops_at_its_work_budget_not_the_clock() -> None:
    """The explanation's feasibility tests give CP-SAT a budget of work
    (deterministic time), which a busy host does not shorten: a budget spent
    ends the search incomplete, one large enough lets it prove its answer."""
    space = space_of(load_problem(CASE6))
    starved = search_cpsat(space, work=1e-9)
    assert not starved.complete and starved.details["rounds"] <= 1
    enough = search_cpsat(space, work=1e6)
    assert enough.complete
