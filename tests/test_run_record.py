"""The run record (``RUN_DIR/run.json``) as a pydantic model with a typed plan:
a record in the format the runtime wrote before it was a model (the keys and
values below are what its hand-written ``to_dict`` gave, a solved plan of the
demo problem) still reads, resumes with its plan and problem, and is written
back byte for byte; a bad field names its JSON path in the file. The run
log's events (re-plans, preemptions, segments, monitor verdicts) and the
run's result are pydantic dataclasses whose JSON has the keys the log had."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from thrifty.core.errors import ProblemError
from thrifty.core.validation import json_object, validate_model
from thrifty.runtime.training.plans import run_plan
from thrifty.runtime.training.rundir import RunRecord, read_run_record, write_run_record
from thrifty.solver.plan import Plan

EXAMPLES = Path(__file__).resolve().parents[1] / "datasets" / "examples"

# the plan of the demo problem, as `Plan.to_dict` wrote it into run.json
OLD_PLAN = {
    "kind": "training", "status": "optimal", "objective": "min_cost", "objective_value": 0.013333333333333334,
    "allocation": [{"instance_type": "local-a", "market": "spot", "count": 2, "batch_per_instance": 32}],
    "predicted": {"iteration_s": 0.03417451845346804, "total_s": 25.504711072080823,
                  "cost_usd": 0.013333333333333334, "total_s_p95": 25.549664482534702,
                  "iteration_s_p95": 0.036038256530359095, "throughput_samples_s": 1872.7403602523991},
    "solver": {"method": "exhaustive", "wall_s": 0.330435343001227, "gap": 0.0, "candidates_simulated": 1,
               "details": {"candidates": 57, "pruned": True, "space_size": 336.0}},
    "name": "Srifty 5.4 in miniature: a tiny transformer on local pseudo machines (demo prices)",
}


def old_record() -> dict:
    """A run.json as the runtime wrote it before the record was a model (its
    ``to_dict``: ``format``, then the fields in order), after one re-plan."""
    problem = json.loads((EXAMPLES / "local-demo-srifty54.json").read_text())
    problem["catalog"] = str((EXAMPLES / problem["catalog"]).resolve())  # absolute, as the runtime writes it
    replanned = {**OLD_PLAN, "allocation": [{**OLD_PLAN["allocation"][0], "count": 1, "batch_per_instance": 64}]}
    return copy.deepcopy({"format": "thrifty.run/1", "run_id": "20250102-153000-1a2b", "plan": replanned,
                          "problem": problem, "trainer": "thrifty.runtime.training.examples:tiny_mlp",
                          "trainer_args": {"hidden": 8}, "config": {"window_s": None, "checkpoint": None},
                          "first_plan": OLD_PLAN, "cluster": None, "options": {"plot": "/tmp/run.png"}})


def write_old(folder: Path, record: dict) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1) + "\n"  # thrifty.core.io.write_json, as it wrote the record
    (folder / "run.json").write_text(text)
    return text


def test_an_old_run_record_reads_typed_and_writes_back_byte_for_byte(tmp_path):
    text = write_old(tmp_path / "old", old_record())
    record = read_run_record(tmp_path / "old")
    assert isinstance(record, RunRecord)
    assert isinstance(record.plan, Plan) and isinstance(record.first_plan, Plan)
    assert record.plan.config == "1xlocal-a@64" and record.first_plan.config == "2xlocal-a@32"
    assert record.first_plan.problem_name == OLD_PLAN["name"]
    assert record.trainer_args == {"hidden": 8} and record.options == {"plot": "/tmp/run.png"}
    write_run_record(tmp_path / "new", record)
    assert (tmp_path / "new" / "run.json").read_text() == text  # the file format did not change


def test_an_old_run_record_resumes_with_its_plan_and_problem(tmp_path):
    write_old(tmp_path, old_record())
    record = read_run_record(tmp_path)
    got = run_plan(None, None, record, tmp_path)
    plan, problem = got.plan, got.problem
    assert plan == record.plan and plan.config == "1xlocal-a@64"  # the plan in force, the re-plan's
    assert problem.iterations == 600 and problem.limits.time_s == 30


def test_a_record_without_the_later_keys_still_reads(tmp_path):
    """Records from before ``first_plan``, ``cluster`` and ``options`` were kept, and keys
    this version does not know (a later one's), read as before."""
    old = {k: v for k, v in old_record().items() if k not in ("first_plan", "cluster", "options")}
    write_old(tmp_path, {**old, "written_by": "a later thrifty"})
    record = read_run_record(tmp_path)
    assert record.first_plan is None and record.cluster is None and record.options == {}


@pytest.mark.parametrize("change, path", [
    (lambda r: r["plan"]["allocation"][0].update(count=0), "plan.allocation[0].count"),
    (lambda r: r["first_plan"].pop("status"), "first_plan.status"),
    (lambda r: r.pop("trainer"), "trainer"),
    (lambda r: r.update(trainer_args=[1]), "trainer_args"),
])
def test_a_bad_run_record_names_the_field_in_the_file(tmp_path, change, path):
    record = old_record()
    change(record)
    write_old(tmp_path, record)
    with pytest.raises(ProblemError) as e:
        read_run_record(tmp_path)
    assert e.value.path == path and e.value.source == str(tmp_path / "run.json")


def test_a_run_record_of_another_format_is_refused(tmp_path):
    write_old(tmp_path, {**old_record(), "format": "thrifty.run/2"})
    with pytest.raises(ProblemError, match="is not a thrifty run record"):
        read_run_record(tmp_path)


# -- the run log's events: pydantic dataclasses whose JSON keeps the keys the log always had ----------

def demo_replan():
    from thrifty.runtime.events import Preemption
    from thrifty.runtime.training.replan import Replan
    from thrifty.solver.problem import load_problem

    problem = load_problem(EXAMPLES / "local-demo-srifty54.json")
    old, new = validate_model(Plan, OLD_PLAN), validate_model(Plan, old_record()["plan"])
    event = Preemption("local-a", "spot", "injector", "m0", 120.0, at=5.0)
    return Replan("preemption", old, new, problem, 0.5, 0.2, event, (("local-a", "spot"),)), problem, event


def test_a_replan_event_writes_what_the_run_log_always_had():
    replan, problem, event = demo_replan()
    written = json.loads(json.dumps(json_object(replan)))
    assert written == {
        "reason": "preemption", "old_config": "2xlocal-a@32", "new_config": "1xlocal-a@64", "latency_s": 0.5,
        "solve_s": 0.2, "depleted": [["local-a", "spot"]], "best_effort": None,
        "trigger": {"instance_type": "local-a", "market": "spot", "source": "injector", "machine_id": "m0",
                    "time_left_s": 120.0, "reason": "", "at": 5.0},
        "problem": {"iterations": 600, "limits": problem.limits.model_dump(), "launch_s": 5.0,
                    "instances": [c.model_dump() for c in problem.instances]},
        "plan": old_record()["plan"]}


def test_the_run_records_write_their_keys_and_derived_figures():
    from thrifty.runtime.training.driver import PredictionOff, RunResult, SegmentRecord
    from thrifty.runtime.training.monitor import ThroughputWindow, Verdict

    segment = SegmentRecord(0, "2xlocal-a@32", [32, 32], 0, 10, 8, "stopped", 1.5, [0.1], 20.0, 0.04)
    assert json_object(segment) == {
        "index": 0, "config": "2xlocal-a@32", "batches": (32, 32), "start_iteration": 0, "reached_iteration": 10,
        "committed_iteration": 8, "ended": "stopped", "launch_s": 1.5, "checkpoint_s": (0.1,), "throughput": 20.0,
        "predicted_iteration_s": 0.04, "lost_iterations": 2, "actual_iteration_s": 0.05,
        "prediction_ratio": pytest.approx(1.25)}
    verdict = Verdict(1.0, 3, 10, 0.1, ThroughputWindow(1.0, 0.1, 1.2, 5, 10.0), float("inf"), 2.0, None, None,
                      ("time",), True)
    line = json.dumps(json_object(verdict))  # an infinite projection stays a number, as the log always wrote it
    assert json.loads(line)["projected_total_s"] == float("inf") and json.loads(line)["window"]["bins"] == 5
    assert set(json.loads(line)) == {"elapsed_s", "iterations", "total_iterations", "spent_usd", "window",
                                     "projected_total_s", "optimistic_total_s", "projected_cost_usd",
                                     "optimistic_cost_usd", "violation", "replan"}
    said = PredictionOff(0, "2xlocal-a@32", 2.0, 1.0, "contention", "thrifty profile ...")
    assert json_object(said)["ratio"] == 2.0
    replan, _, event = demo_replan()
    result = RunResult("r", Path("/runs/r"), 600, 600, 31.0, 0.06, 30.0, None, (replan.old_plan, replan.new_plan),
                       (replan,), (event,), (segment,), checkpoint="s3://bucket/key")
    written = json.loads(json.dumps(json_object(result)))  # thrifty run --json
    assert list(written) == ["run_id", "run_dir", "iterations", "total_iterations", "elapsed_s", "cost_usd",
                             "time_limit_s", "cost_limit_usd", "replans", "preemptions", "segments", "within_limits",
                             "exceeded", "configs"]
    assert written["run_dir"] == "/runs/r" and written["configs"] == ["2xlocal-a@32", "1xlocal-a@64"]
    assert written["within_limits"] is False and written["exceeded"] == result.exceeded
    assert written["replans"][0]["plan"] == old_record()["plan"] and written["segments"][0]["lost_iterations"] == 2


def test_a_run_record_is_validated_when_made():
    from pydantic import ValidationError

    from thrifty.runtime.events import Preemption

    with pytest.raises(ValidationError):
        Preemption("local-a", "spot", "a rumour")  # not a known source
