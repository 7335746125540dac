"""The training solver: methods agree with exhaustive search, plans satisfy every
constraint, infeasibility is explained with tight relaxations, bad input is rejected."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thrifty.datasets.catalog import Catalog
from thrifty.core.errors import ProblemError
from thrifty.perfmodels.bandwidth import AnalyticAllreduce
from thrifty.perfmodels.library import ModelLibrary
from thrifty.runtime.cli import main
from thrifty.solver.problem import parse_problem
from thrifty.solver.solve import solve
from thrifty.solver.training import TrainingSpace

from helpers import compute_model, instance

LAYERS = tuple((2_000_000, (i + 1) / 8) for i in range(8))
LIB = ModelLibrary(paths=[])
LIB.add(compute_model(device="A", fw=(0.010, 0.0005), bw=(0.020, 0.0010), cv=0.03, layers=LAYERS, max_batch=512,
                      batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512)))
LIB.add(compute_model(device="B", fw=(0.004, 0.0002), bw=(0.008, 0.0004), cv=0.02, layers=LAYERS, max_batch=256))
LIB.add(compute_model(device="C", fw=(0.006, 0.0003), bw=(0.012, 0.0006), cv=0.05, layers=LAYERS, max_batch=128,
                      batches=(1, 2, 4, 8, 16, 32, 64, 128)))
CATALOG = Catalog("test", "r", {
    "a1": instance("a1", gpus=1, device="A", on_demand=0.5, spot=0.2, network_gbps=10),
    "b4": instance("b4", gpus=4, device="B", on_demand=3.0, spot=1.1, network_gbps=25),
    "c2": instance("c2", gpus=2, device="C", on_demand=1.2, spot=0.4, network_gbps=10),
}, "test catalog", {})
BANDWIDTH = AnalyticAllreduce()


def space_of(problem: dict) -> TrainingSpace:
    return TrainingSpace(parse_problem(problem), library=LIB, catalog=CATALOG, bandwidth=BANDWIDTH)


def problem_dict(choices, global_batch, iterations, objective, time_s=None, cost_usd=None):
    limits = {k: v for k, v in (("time_s", time_s), ("cost_usd", cost_usd)) if v is not None}
    return {"kind": "training", "model": "m", "global_batch": global_batch, "iterations": iterations,
            "objective": objective, "limits": limits,
            "instances": [{"instance_type": t, "market": m, "quota": q} for t, m, q in choices]}


@st.composite
def problems(draw):
    pool = [("a1", "on_demand"), ("a1", "spot"), ("b4", "on_demand"), ("b4", "spot"), ("c2", "on_demand")]
    picked = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3, unique=True))
    choices = [(t, m, draw(st.integers(1, 6))) for t, m in picked]
    global_batch = draw(st.sampled_from([64, 128, 256, 512, 768]))
    iterations = draw(st.integers(10, 2000))
    objective = draw(st.sampled_from(["min_cost", "min_time"]))
    # limits as fractions of a reference scale, so some bind and some do not
    time_s = draw(st.none() | st.floats(0.02, 0.3).map(lambda f: f * iterations))
    cost_usd = draw(st.none() | st.floats(0.2, 5.0).map(lambda f: f * iterations * 1e-5))
    return problem_dict(choices, global_batch, iterations, objective, time_s, cost_usd)


def check_plan_satisfies(problem: dict, plan) -> None:
    assert sum(a.count * a.batch_per_instance for a in plan.allocation) == problem["global_batch"]
    quotas = {(c["instance_type"], c["market"]): c["quota"] for c in problem["instances"]}
    for a in plan.allocation:
        assert 1 <= a.count <= quotas[(a.instance_type, a.market)]
    limits = problem["limits"]
    if "time_s" in limits:
        assert plan.predicted.total_s <= limits["time_s"]
    if "cost_usd" in limits:
        assert plan.predicted.cost_usd <= limits["cost_usd"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_ilp_and_smt_reach_the_exhaustive_optimum(problem):
    plans = {m: solve(problem, method=m, space=space_of(problem)) for m in ("exhaustive", "ilp", "smt")}
    statuses = {m: p.status for m, p in plans.items()}
    assert len({p.feasible for p in plans.values()}) == 1, statuses
    if plans["exhaustive"].feasible:
        best = plans["exhaustive"].objective_value
        for method, plan in plans.items():
            assert plan.status == "optimal", (method, statuses)
            assert plan.objective_value == pytest.approx(best, rel=1e-9), method
            check_plan_satisfies(problem, plan)
            assert plan.solver.gap == 0.0
    else:
        for plan in plans.values():
            assert plan.allocation == [] and plan.infeasibility is not None


def test_exhaustive_pruning_finds_the_same_optimum_as_simulating_everything():
    from thrifty.solver.search import search_exhaustive

    problem = problem_dict([("a1", "on_demand", 6), ("b4", "spot", 3), ("c2", "on_demand", 4)], 512, 500, "min_cost",
                           time_s=40.0)
    pruned = search_exhaustive(space_of(problem), prune=True)
    full = search_exhaustive(space_of(problem), prune=False)
    assert pruned.best.candidate == full.best.candidate
    assert full.simulated == full.details["candidates"]
    assert pruned.simulated < full.simulated


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), problems())
def test_a_derived_space_prunes_as_a_fresh_space_of_its_problem_does(first, second):
    """A derived space shares its parent's group bounds (`BoundCache`): whatever the variant changes
    (limits, quotas, the machine types and their order, the global batch), it enumerates the same
    candidates, in the same order, as a space of that problem that shares nothing."""
    parent = space_of(first)
    for _ in parent.candidates(within_limits=True):  # the parent's bounds are in the cache
        pass
    changes = parse_problem(second)
    derived = parent.derive(limits=changes.limits, instances=changes.instances, global_batch=changes.global_batch,
                            iterations=changes.iterations)
    fresh = space_of(json.loads(derived.problem.model_dump_json(exclude_none=True)))
    assert list(derived.candidates(within_limits=True)) == list(fresh.candidates(within_limits=True))
    for candidate in fresh.candidates():
        for k, count, batch in candidate:
            assert derived.group_bound(k, count, batch) == fresh.group_bound(k, count, batch)


def _apply(problem: dict, field: str, value) -> dict:
    out = json.loads(json.dumps(problem))
    if field.startswith("limits."):
        out["limits"][field.split(".", 1)[1]] = value
    else:  # instances[i].quota
        index = int(field[field.index("[") + 1: field.index("]")])
        out["instances"][index]["quota"] = value
    return out


@pytest.mark.parametrize("problem", [
    # too tight a deadline for the quotas
    problem_dict([("a1", "on_demand", 2), ("c2", "on_demand", 1)], 256, 1000,
                 "min_cost", time_s=8.0),
    # too small a budget
    problem_dict([("a1", "spot", 4), ("b4", "on_demand", 2)], 512, 1000, "min_time", cost_usd=0.002),
    # both
    problem_dict([("b4", "spot", 1), ("a1", "on_demand", 3)], 512, 2000, "min_time", time_s=20.0, cost_usd=0.004),
])
def test_relaxations_are_tight(problem):
    plan = solve(problem, space=space_of(problem))
    assert plan.status == "infeasible"
    singles = [r for r in plan.infeasibility.relaxations if "field" in r]
    assert plan.infeasibility.relaxations, "an infeasible problem must say what would make it feasible"
    for r in singles:
        field, needed = r["field"], r["needed"]
        relaxed = _apply(problem, field, needed)
        assert solve(relaxed, space=space_of(relaxed)).feasible, field
        smaller = needed - 1 if isinstance(needed, int) else needed * (1 - 1e-6)
        tighter = _apply(problem, field, smaller)
        assert not solve(tighter, space=space_of(tighter)).feasible, field
    for r in plan.infeasibility.relaxations:
        if "fields" in r:
            relaxed = problem
            for field, value in r["needed"].items():
                relaxed = _apply(relaxed, field, value * (1 + 1e-9))
            assert solve(relaxed, space=space_of(relaxed)).feasible


def test_quota_relaxation_is_tight():
    problem = problem_dict([("a1", "on_demand", 1)], 512, 100, "min_cost", time_s=20.0)
    plan = solve(problem, space=space_of(problem))
    assert plan.status == "infeasible"
    quota = [r for r in plan.infeasibility.relaxations if r.get("field") == "instances[0].quota"]
    assert quota, plan.infeasibility
    needed = quota[0]["needed"]
    relaxed = _apply(problem, "instances[0].quota", needed)
    assert solve(relaxed, space=space_of(relaxed)).feasible
    smaller = _apply(problem, "instances[0].quota", needed - 1)
    assert not solve(smaller, space=space_of(smaller)).feasible
    assert "instances[0].quota" in plan.infeasibility.conflicts


def test_unreachable_global_batch_is_infeasible_with_reason():
    problem = problem_dict([("b4", "on_demand", 2)], 100, 10, "min_cost")  # multiples of 4 GPUs x 2^k
    plan = solve(problem, space=space_of(problem))
    assert plan.status == "infeasible"
    assert "sum to the global batch 100" in plan.infeasibility.reason
    assert "global_batch" in plan.infeasibility.conflicts


def test_plan_json_has_contract_keys():
    problem = problem_dict([("a1", "on_demand", 4), ("b4", "spot", 2)], 256, 100, "min_cost", time_s=100.0)
    plan = json.loads(solve(problem, space=space_of(problem)).to_json())
    assert {"kind", "status", "objective", "allocation", "predicted", "solver"} <= set(plan)
    assert set(plan["predicted"]) >= {"iteration_s", "total_s", "cost_usd", "total_s_p95"}
    assert set(plan["solver"]) >= {"method", "wall_s", "gap"}
    assert set(plan["allocation"][0]) == {"instance_type", "market", "count", "batch_per_instance"}
    assert plan["predicted"]["total_s_p95"] >= plan["predicted"]["total_s"]


# -- bad input: one test per case ------------------------------------------------

BASE = problem_dict([("a1", "on_demand", 4)], 256, 100, "min_cost")


@pytest.mark.parametrize("path,value,match", [
    (("iterations",), 0, r"iterations: .*greater than 0"),
    (("iterations",), -5, r"iterations: .*greater than 0"),
    (("global_batch",), 0, r"global_batch: .*greater than 0"),
    (("instances", 0, "quota"), 0, r"instances\[0\]\.quota: .*greater than 0"),
    (("instances", 0, "quota"), -1, r"instances\[0\]\.quota"),
    (("instances", 0, "market"), "reserved", r"instances\[0\]\.market"),
    (("limits", "time_s"), 0, r"limits\.time_s: .*greater than 0"),
    (("limits", "cost_usd"), -1.0, r"limits\.cost_usd: .*greater than 0"),
    (("objective",), "max_fun", r"objective"),
    (("instances",), [], r"instances: .*at least 1"),
    # another JSON type is refused, not converted (true is not 1, "1024" is not 1024, 1 is not true)
    (("global_batch",), True, r"global_batch: .*valid integer \(given True\)"),
    (("global_batch",), "256", r"global_batch: .*valid integer \(given '256'\)"),
    (("limits", "time_s"), True, r"limits\.time_s: .*valid number"),
    (("limits", "time_s"), "100", r"limits\.time_s: .*valid number"),
    (("instances", 0, "quota"), True, r"instances\[0\]\.quota: .*valid integer"),
])
def test_bad_field_names_json_path(path, value, match):
    data = json.loads(json.dumps(BASE))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ProblemError, match=match):
        parse_problem(data)


def test_missing_field_is_named():
    data = dict(BASE)
    del data["global_batch"]
    with pytest.raises(ProblemError, match="global_batch: is required"):
        parse_problem(data)


def test_unknown_field_is_named():
    with pytest.raises(ProblemError, match="deadline: is not a known field"):
        parse_problem({**BASE, "deadline": 3})


def test_duplicate_choice_is_rejected():
    data = problem_dict([("a1", "on_demand", 4), ("a1", "on_demand", 2)], 256, 100, "min_cost")
    with pytest.raises(ProblemError, match=r"instances\[1\]: .* listed twice"):
        parse_problem(data)


def test_unknown_kind():
    with pytest.raises(ProblemError, match="kind: is 'inference'"):
        parse_problem({**BASE, "kind": "inference"})


def test_unknown_instance_type_lists_closest():
    data = problem_dict([("b5", "on_demand", 4)], 256, 100, "min_cost")
    with pytest.raises(ProblemError, match=r"instances\[0\]\.instance_type: unknown instance type 'b5'.*closest"):
        space_of(data)


def test_cli_bad_problem_exits_2_without_traceback(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**BASE, "iterations": -1}))
    assert main(["solve", str(path)]) == 2
    err = capsys.readouterr().err
    assert "iterations" in err and "Traceback" not in err


def test_numbers_from_python_code_are_numbers_and_tuples_are_lists():
    """Strict about JSON types, not about where a number came from: a problem built in Python with numpy
    values and tuples is what its JSON would be."""
    import numpy as np

    data = {**BASE, "global_batch": np.int64(256), "iterations": np.int32(100),
            "limits": {"time_s": np.float32(100.0)}, "respect_threshold": np.bool_(False),
            "instances": tuple(BASE["instances"])}
    problem = parse_problem(data)
    assert (problem.global_batch, problem.iterations, problem.limits.time_s) == (256, 100, 100.0)
    assert problem.respect_threshold is False and type(problem.global_batch) is int


def test_a_number_where_a_float_goes_is_still_a_number():
    assert parse_problem({**BASE, "limits": {"time_s": 100}}).limits.time_s == 100.0


@pytest.mark.parametrize("where", ["a-file/plan.json", "a-folder"])
def test_cli_an_output_that_cannot_be_written_exits_2_before_solving(tmp_path, capsys, where):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    path = tmp_path / "p.json"
    path.write_text(json.dumps(BASE))
    for flag in ("--out", "--plot"):
        with pytest.raises(SystemExit) as exited:  # argparse's usage error: nothing was solved or written
            main(["solve", str(path), flag, str(tmp_path / where)])
        err = capsys.readouterr().err
        assert exited.value.code == 2 and flag in err and "Traceback" not in err, err


def test_an_atomic_write_where_no_file_can_be_is_a_problem_error(tmp_path):
    from thrifty.core.io import atomic_write_text

    (tmp_path / "a-file").write_text("x")
    for where in (tmp_path, tmp_path / "a-file" / "plan.json"):
        with pytest.raises(ProblemError, match="cannot be written"):
            atomic_write_text(where, "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no temporary file left


def test_cli_a_key_given_twice_is_refused_not_silently_the_last(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(BASE)[:-1] + ', "global_batch": 512}')
    assert main(["solve", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and 'the key "global_batch" is given twice' in err and "Traceback" not in err, err


def test_cli_a_yaml_key_given_twice_is_refused_and_a_merge_still_overrides(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text("kind: training\nmodel: m\nglobal_batch: 256\nglobal_batch: 512\n")
    assert main(["solve", str(path)]) == 2
    assert "the key 'global_batch' is given twice in one mapping" in capsys.readouterr().err
    from thrifty.core.io import read_yaml

    path.write_text("base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 5\n")
    assert read_yaml(path)["other"] == {"x": 1, "y": 5}


def test_yaml_nested_deeper_than_the_limit_is_refused_before_the_parser_spends_time_on_it(tmp_path, capsys):
    """PyYAML's scanner rescans every open flow level at every token (seconds for a few thousand levels), so
    a document deeper than `YAML_MAX_FLOW_DEPTH` is refused as nested too deeply; at the limit it is read."""
    from thrifty.core.io import YAML_MAX_FLOW_DEPTH, flow_depth, read_yaml

    depth = YAML_MAX_FLOW_DEPTH
    path = tmp_path / "p.yaml"
    path.write_text("x: " + "[" * depth + "]" * depth + "\n")
    value = read_yaml(path)["x"]
    for _ in range(depth - 1):
        value = value[0]
    assert value == []
    path.write_text("x: " + "[" * (depth + 1) + "]" * (depth + 1) + "\n")
    assert main(["solve", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "nested too deeply" in err and "Traceback" not in err, err
    # brackets inside quoted scalars and comments do not nest
    assert flow_depth("a: \"[[[[\"\nb: 'it''s [[[' # [[[\nc: [1, {d: [2]}]\n") == 3


def test_cli_an_error_found_past_the_schema_names_the_file(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**BASE, "model": "resnet9000"}))
    assert main(["solve", str(path)]) == 2
    assert f"{path}: instances[0].instance_type: unknown instance type 'a1'" in capsys.readouterr().err


def test_cli_malformed_json_exits_2(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text("{")
    assert main(["solve", str(path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_schema_command_prints_json_schema(capsys):
    assert main(["schema", "training"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "global_batch" in schema["properties"]


def test_the_public_entry_points_of_design_md():
    import subprocess
    import sys

    code = ("import sys; from thrifty.solver import solve, Problem, Plan; "
            "plan = solve('datasets/examples/srifty-case1-resnet50.json'); "
            "assert isinstance(plan, Plan) and plan.status == 'optimal', plan.status; "
            "assert not {'torch', 'boto3', 'ray'} & set(sys.modules), 'heavy imports on the solve path'")
    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_group_sums_match_one_shift_per_machine_count() -> None:
    """`group_sums` (one cumulative sum) equals adding ways shifted by every
    machine count 1..quota, for float and integer counts."""
    from thrifty.solver.training import group_sums

    rng = np.random.default_rng(0)
    for _ in range(300):
        n, batch, quota = int(rng.integers(1, 60)), int(rng.integers(1, 20)), int(rng.integers(1, 10))
        ways = rng.integers(0, 5, n)
        expected = np.zeros(n, dtype=np.int64)
        for count in range(1, quota + 1):
            if count * batch < n:
                expected[count * batch:] += ways[: n - count * batch]
        assert (group_sums(ways.astype(np.int64), batch, quota) == expected).all()
        assert np.array_equal(group_sums(ways.astype(float), batch, quota), expected.astype(float))
