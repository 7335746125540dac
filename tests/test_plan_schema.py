"""Plans as schema-owned contracts: the solver's pydantic models write a plan's
JSON, read it back to the same bytes, name the JSON path of a bad field, and
export the JSON Schema that ``thrifty schema plan|tuning-plan`` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrifty.core.errors import ProblemError
from thrifty.core.validation import validate_model
from thrifty.runtime.cli import main
from thrifty.runtime.training.plans import as_plan
from thrifty.runtime.tuning.executors.plan import runnable_plan
from thrifty.solver import solve
from thrifty.solver.plan import Plan
from thrifty.solver.tuning_plan import TuningPlan, TuningStage

EXAMPLES = Path(__file__).resolve().parents[1] / "datasets" / "examples"
DEMO = EXAMPLES / "local-demo-srifty54.json"
SHA = EXAMPLES / "rubberband-sha32-resnet101.json"
TINY = "thrifty.runtime.training.examples:tiny_mlp"

TRAINING_KEYS = ["kind", "status", "objective", "objective_value", "allocation", "predicted", "provenance", "solver",
                 "name"]
TUNING_KEYS = ["kind", "status", "experiment", "deadline_s", "billing", "stages", "predicted", "baselines",
               "provenance", "solver", "name"]


def sha(**changes) -> dict:
    return {**json.loads(SHA.read_text()), "samples": 50, **changes}


@pytest.fixture(scope="module")
def training_plans() -> dict[str, Plan]:
    return {"feasible": solve(DEMO), "infeasible": solve(EXAMPLES / "srifty-case6-inception.json")}


@pytest.fixture(scope="module")
def tuning_plans() -> dict[str, TuningPlan]:
    return {"feasible": solve(sha()), "infeasible": solve(sha(deadline_s=300))}


# -- the same JSON, there and back ------------------------------------------------------

@pytest.mark.parametrize("status", ["feasible", "infeasible"])
def test_a_training_plan_reads_back_to_the_same_json(training_plans, status):
    plan = training_plans[status]
    text = plan.to_json()
    assert plan.feasible == (status == "feasible")
    back = validate_model(Plan, json.loads(text))
    assert back == plan and back.to_json() == text
    assert as_plan(json.loads(text)).to_json() == text  # as the runtime reads a plan file
    keys = TRAINING_KEYS if plan.feasible else TRAINING_KEYS[:-1] + ["infeasibility", "name"]
    assert list(json.loads(text)) == keys


@pytest.mark.parametrize("status", ["feasible", "infeasible"])
def test_a_tuning_plan_reads_back_to_the_same_json(tuning_plans, status):
    plan = tuning_plans[status]
    text = plan.to_json()
    back = validate_model(TuningPlan, json.loads(text))
    assert back == plan and back.to_json() == text
    keys = TUNING_KEYS if plan.feasible else TUNING_KEYS[:-1] + ["infeasibility", "name"]
    assert list(json.loads(text)) == keys


def test_tuning_plan_parts_are_typed_and_write_their_json(tuning_plans):
    plan = tuning_plans["feasible"]
    stage = plan.stages[0]
    assert isinstance(stage, TuningStage)
    assert list(stage.model_dump()) == ["trials", "iters_per_trial", "gpus", "gpus_per_trial", "instances",
                                        "instance_type", "start_s", "end_s", "cost_usd"]
    assert stage.model_dump()["trials"] == stage.trials == 32 and "end_s" in stage.model_dump()
    assert plan.model_dump()["predicted"]["jct_s"] == plan.predicted.jct_s
    assert plan.baselines["greedy"].predicted.cost_usd >= plan.predicted.cost_usd - 1e-9
    # the exact formulation's own figures stay, after the known keys
    assert plan.solver.chosen == plan.solver.model_dump()["chosen"] and "options" in plan.solver.model_dump()
    assert plan.infeasibility is None and "infeasibility" not in plan.model_dump()


@pytest.mark.parametrize("part", ["plan", "stage", "predicted", "solver"])
def test_typed_plans_are_read_by_attribute_not_by_key(tuning_plans, training_plans, part):
    """A plan is no mapping: code reads its fields as attributes (a typo is then
    an AttributeError, and mypy sees it), and the JSON object is model_dump's."""
    plan = tuning_plans["feasible"]
    record = {"plan": training_plans["feasible"], "stage": plan.stages[0], "predicted": plan.predicted,
              "solver": plan.solver}[part]
    key = next(iter(record.model_dump()))
    with pytest.raises(TypeError):
        record[key]
    assert not hasattr(record, "get") and not hasattr(record, "keys")


def test_a_hand_written_stage_writes_only_what_it_was_given():
    stage = validate_model(TuningStage, {"trials": 4, "iters_per_trial": 1, "gpus_per_trial": 1, "instances": 2})
    assert stage.model_dump() == {"trials": 4, "iters_per_trial": 1, "gpus_per_trial": 1, "instances": 2}
    assert stage.start_s is None and "start_s" not in stage.model_dump()


def test_with_changes_validates_and_leaves_the_plan_as_it_was(training_plans):
    plan = training_plans["feasible"]
    renamed = plan.with_changes(problem_name="renamed")
    assert json.loads(renamed.to_json())["name"] == "renamed" and plan.problem_name != "renamed"
    with pytest.raises(ProblemError) as e:
        plan.with_changes(status="done")
    assert e.value.path == "status"


# -- bad plans name the field --------------------------------------------------------------

@pytest.mark.parametrize("change, path", [
    (lambda p: p["allocation"][0].update(count="two"), "allocation[0].count"),
    (lambda p: p["allocation"][0].update(count=0), "allocation[0].count"),
    (lambda p: p["allocation"][0].pop("market"), "allocation[0].market"),
    (lambda p: p["predicted"].update(totl_s=1.0), "predicted.totl_s"),  # a misspelt key is refused
    (lambda p: p.update(status="done"), "status"),
])
def test_a_bad_training_plan_field_is_named(training_plans, change, path):
    data = json.loads(training_plans["feasible"].to_json())
    change(data)
    with pytest.raises(ProblemError) as e:
        as_plan(data, source="plan.json")
    assert e.value.path == path and str(e.value).startswith(f"plan.json: {path}: ")


def test_thrifty_run_refuses_a_bad_plan_file_with_exit_2(training_plans, tmp_path, capsys):
    data = json.loads(training_plans["feasible"].to_json())
    data["allocation"][0]["batch_per_instance"] = 2.5
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    code = main(["run", str(plan), "--problem", str(DEMO), "--trainer", TINY, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{plan}: allocation[0].batch_per_instance: " in err and "Traceback" not in err


@pytest.mark.parametrize("change, path", [
    (lambda p: p["stages"][1].update(trials=0), "stages[1].trials"),
    (lambda p: p["stages"][1].update(trials=True), "stages[1].trials"),
    (lambda p: p["stages"][0].pop("instances"), "stages[0].instances"),
    (lambda p: p["predicted"].pop("jct_s"), "predicted.jct_s"),
    (lambda p: p["baselines"]["greedy"].update(status="unknown"), "baselines.greedy.status"),
    (lambda p: p.pop("stages"), "stages"),
])
def test_a_bad_tuning_plan_field_is_named(tuning_plans, change, path):
    data = json.loads(tuning_plans["feasible"].to_json())
    change(data)
    with pytest.raises(ProblemError) as e:
        validate_model(TuningPlan, data)
    assert e.value.path == path
    with pytest.raises(ProblemError) as e:
        runnable_plan(data)  # as the plan executor reads it
    assert e.value.path == path


def test_the_plan_executor_runs_only_a_feasible_plan_and_fills_in_the_instance_type(tuning_plans):
    with pytest.raises(ProblemError) as e:
        runnable_plan(tuning_plans["infeasible"])
    assert e.value.path == "status"
    stages = [{"trials": 2, "iters_per_trial": 1, "gpus_per_trial": 1, "instances": 1}]
    with pytest.raises(ProblemError) as e:
        runnable_plan({"stages": stages})
    assert e.value.path == "stages[0].instance_type"
    plan = runnable_plan({"stages": stages}, instance_type="p3.8xlarge")
    assert plan.stages[0].instance_type == "p3.8xlarge" and plan.feasible


# -- thrifty schema plan | tuning-plan ---------------------------------------------------------

def schema_of(kind: str, capsys) -> dict:
    assert main(["schema", kind]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind, plans", [("plan", "training_plans"), ("tuning-plan", "tuning_plans")])
def test_schema_command_prints_the_plan_schema(kind, plans, capsys, request):
    schema = schema_of(kind, capsys)
    required = {"plan": {"kind", "status", "objective", "allocation"}, "tuning-plan": {"kind", "status", "stages"}}
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert set(schema["required"]) == required[kind]
    for plan in request.getfixturevalue(plans).values():
        assert set(plan.model_dump()) <= set(schema["properties"])  # "name" included, not "problem_name"


@pytest.mark.parametrize("kind, plans", [("plan", "training_plans"), ("tuning-plan", "tuning_plans")])
def test_the_plan_schema_validates_real_plans_and_refuses_a_bad_one(kind, plans, capsys, request):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the ray extra ([all])")
    validator = jsonschema.Draft202012Validator(schema_of(kind, capsys))
    for plan in request.getfixturevalue(plans).values():
        validator.validate(json.loads(plan.to_json()))
    data = json.loads(request.getfixturevalue(plans)["feasible"].to_json())
    rows = data["allocation"] if kind == "plan" else data["stages"]
    rows[0]["count" if kind == "plan" else "trials"] = 0
    assert not validator.is_valid(data)


def test_problem_schemas_are_unchanged_by_the_plan_schemas(capsys):
    assert "global_batch" in schema_of("training", capsys)["properties"]
    assert "deadline_s" in schema_of("tuning", capsys)["properties"]
