"""The experiment file's ``resources.market``: the market of the machines a
tuning run takes (``on_demand``, the default as in a training problem, or
``spot``). It is in the file's schema, it prices the RubberBand plan, and the
run takes its machines in it (on a cluster: `test_cluster_ray_start`, whose
nodes are all spot machines)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrifty.core.errors import ProblemError
from thrifty.runtime.cli import main
from thrifty.runtime.tuning import driver
from thrifty.runtime.tuning.driver import check_startable, tune
from thrifty.runtime.tuning.experiment_file import parse_experiment

ROOT = Path(__file__).resolve().parents[1]
CATALOG = str(ROOT / "datasets" / "examples" / "local-demo-catalog.json")
EXAMPLE = "thrifty.runtime.tuning.executors.worlds:example_trainer"


def plan_experiment(tmp_path: Path, **resources) -> dict:
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"format": "thrifty.scaling_profile/1", "model": "example",
                                   "instance_type": "local-a", "startup_s": 0.5,
                                   "points": [{"gpus": 1, "iteration_s": 0.05}, {"gpus": 2, "iteration_s": 0.04}]}))
    return {"name": "market", "trainer": EXAMPLE, "search_space": {"lr": {"loguniform": [0.003, 0.5]}},
            "samples": 4, "max_iterations": 4, "deadline_s": 30,
            "scheduler": {"name": "plan", "min_iterations": 1, "eta": 2},
            "resources": {"instance_type": "local-a", "catalog": CATALOG, "max_instances": 2,
                          "model": str(profile), **resources}}


def test_the_schema_shows_the_market_and_its_default(capsys):
    assert main(["schema", "experiment"]) == 0
    schema = json.loads(capsys.readouterr().out)
    market = schema["$defs"]["Resources"]["properties"]["market"]
    assert market["enum"] == ["on_demand", "spot"] and market["default"] == "on_demand"


def test_a_market_other_than_the_two_names_its_field(tmp_path):
    with pytest.raises(ProblemError) as error:
        parse_experiment(plan_experiment(tmp_path, market="reserved"))
    assert error.value.path == "resources.market"


def test_the_plan_is_priced_in_the_files_market(tmp_path):
    on_demand = check_startable(parse_experiment(plan_experiment(tmp_path)), "local")
    spot = check_startable(parse_experiment(plan_experiment(tmp_path, market="spot")), "local")
    assert [s.instances for s in spot.plan.stages] == [s.instances for s in on_demand.plan.stages]
    # local-a: $1.20 an hour on demand, $0.40 spot (the demo catalog)
    assert spot.predicted_usd == pytest.approx(on_demand.predicted_usd * 0.4 / 1.2, rel=1e-9)


def test_the_plan_takes_its_machines_in_the_files_market(tmp_path, monkeypatch):
    from thrifty.runtime.tuning.executors import plan as executor_plan

    taken: list[str] = []

    class Recording(executor_plan.PlanExecutor):
        def __init__(self, *args, **options):
            super().__init__(*args, **options)
            taken.append(self.market)

    monkeypatch.setattr(executor_plan, "PlanExecutor", Recording)
    result = tune(plan_experiment(tmp_path, market="spot"), out=tmp_path / "out")
    assert taken == ["spot"] and result.end_reason.startswith("plan")
    assert driver.tuning_problem(result.experiment)["market"] == "spot"
