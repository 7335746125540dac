"""Provenance (issue 36): every plan says, per instance type, where its
compute and allreduce figures came from (measured, corrected online,
derived, analytic) and says FALLBACK when a figure fell back; a tuning plan
also says where its SCALE and INIT latencies came from; ``thrifty validate
--device cuda`` prices communication with the model of the type it runs on.
No process starts here: solving, the model chain and the type choice only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from thrifty.core.errors import ProblemError
from thrifty.datasets.catalog import load_catalog
from thrifty.perfmodels.cluster import MachineGroup
from thrifty.perfmodels.compute import ComputeModel
from thrifty.perfmodels.library import ModelLibrary
from thrifty.perfmodels.loading import default_bandwidth_model
from thrifty.perfmodels.profile import ComputeProfile
from thrifty.perfmodels.simulator import IterationSimulator
from thrifty.runtime.cli import main
from thrifty.solver.problem import parse_problem
from thrifty.solver.tuning import TuningSpace

from helpers import profile_dict

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "datasets" / "examples"
AWS = ROOT / "datasets" / "catalog" / "aws-us-east-1.json"
DEMO_CATALOG = EXAMPLES / "local-demo-catalog.json"


def gpu_problem(path: Path, **changes) -> Path:
    """ResNet-50 on a p5 (H100: no derived allreduce model has a basis for it) beside a g5 (A10G: one has)."""
    problem = {"kind": "training", "model": "resnet50", "global_batch": 256, "iterations": 100,
               "catalog": str(AWS), "objective": "min_cost",
               "instances": [{"instance_type": "p5.48xlarge", "market": "on_demand", "quota": 1},
                             {"instance_type": "g5.12xlarge", "market": "on_demand", "quota": 2}], **changes}
    path.write_text(json.dumps(problem))
    return path


@pytest.fixture(scope="module")
def gpu_plan(tmp_path_factory) -> dict:
    path = gpu_problem(tmp_path_factory.mktemp("p5") / "p5.json")
    out = tmp_path_factory.mktemp("out") / "plan.json"
    assert main(["solve", str(path), "--json", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_solve_json_says_p5_allreduce_is_the_analytic_ring_as_a_fallback(gpu_plan):
    p5 = gpu_plan["provenance"]["p5.48xlarge"]
    assert (p5["allreduce"]["kind"], p5["allreduce"]["model"], p5["allreduce"]["fallback"]) == (
        "analytic", "analytic ring", True)
    # why: the derived cloud model passed it on, and says so
    assert any("no basis for H100" in why for why in p5["allreduce"]["passed_over"])
    # its compute figures are the H100 profile thrifty measured on a GPU
    assert p5["compute"]["kind"] == "measured"
    assert p5["compute"]["file"] == "datasets/profiles/measured/resnet50__H100.json" and p5["compute"]["machine"]


def test_solve_json_says_a_derived_type_is_derived_with_its_files_and_no_fallback(gpu_plan):
    g5 = gpu_plan["provenance"]["g5.12xlarge"]
    assert g5["compute"] == {"kind": "derived", "model": "compute profile", "fallback": False,
                             "file": "datasets/profiles/derived/resnet50__A10G.json",
                             "script": "datasets/scripts/derive_profiles.py", "date": g5["compute"]["date"]}
    assert (g5["allreduce"]["kind"], g5["allreduce"]["fallback"]) == ("derived", False)
    assert g5["allreduce"]["file"] == "datasets/allreduce/cloud-derived-model.json"
    assert g5["allreduce"]["script"] == "datasets/scripts/derive_cloud_allreduce.py"
    assert "passed_over" not in g5["allreduce"]  # the host's own gloo model was never meant for it


def test_the_text_plan_says_where_the_figures_came_from_and_the_fallback(tmp_path, capsys):
    assert main(["solve", str(gpu_problem(tmp_path / "p.json"))]) == 0
    out = capsys.readouterr().out
    assert "where the figures came from:" in out
    lines = {line.strip().split(":", 1)[0]: line for line in out.splitlines() if ":" in line}
    assert "analytic (analytic ring)" in lines["p5.48xlarge allreduce"]
    assert "FALLBACK" in lines["p5.48xlarge allreduce"] and "no basis for H100" in lines["p5.48xlarge allreduce"]
    assert "derived (datasets/allreduce/cloud-derived-model.json)" in lines["g5.12xlarge allreduce"]
    assert "FALLBACK" not in lines["g5.12xlarge allreduce"] + lines["g5.12xlarge compute"]
    assert lines["p5.48xlarge compute"].strip().startswith(
        "p5.48xlarge compute: measured (datasets/profiles/measured/resnet50__H100.json) on ")


def test_simulate_says_it_too_for_p4d(capsys):
    assert main(["simulate", "--model", "resnet50", "--config", "2xp4d.24xlarge@256", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["provenance"]["p4d.24xlarge"]
    assert (said["allreduce"]["kind"], said["allreduce"]["fallback"]) == ("analytic", True)
    assert said["compute"]["file"] == "datasets/profiles/derived/resnet50__A100.json"


def test_an_infeasible_plan_says_it_too(tmp_path, capsys):
    path = gpu_problem(tmp_path / "p.json", limits={"time_s": 0.001})
    assert main(["solve", str(path), "--json"]) == 3
    plan = json.loads(capsys.readouterr().out)
    assert plan["status"] == "infeasible" and set(plan["provenance"]) == {"p5.48xlarge", "g5.12xlarge"}


def test_host_worker_types_are_priced_by_the_probes_measured_here():
    from thrifty.solver.solve import solve

    plan = solve(EXAMPLES / "local-demo-srifty54.json")
    a = plan.provenance["local-a"]
    assert (a.allreduce.kind, a.allreduce.fallback, a.allreduce.file) == (
        "measured", False, "datasets/allreduce/local-gloo-model.json")
    assert "probe cells of local" in a.allreduce.note and "as local does" in a.allreduce.note
    assert a.compute.kind == "measured" and a.compute.file == "datasets/profiles/measured/tiny-transformer__cpu.json"


def test_a_model_file_the_problem_names_reports_the_types_it_lacks_as_fallbacks(tmp_path):
    from thrifty.solver.solve import solve

    named = str(ROOT / "datasets" / "allreduce" / "local-gloo-model.json")
    plan = solve(gpu_problem(tmp_path / "p.json", allreduce=named))
    g5 = plan.provenance["g5.12xlarge"].allreduce
    assert (g5.kind, g5.fallback) == ("derived", True)
    assert g5.passed_over == ["datasets/allreduce/local-gloo-model.json has no probes of g5.12xlarge (it has local)"]


def _bundle(path: Path, device: str, instance_type: str) -> Path:
    path.write_text(json.dumps({"format": "thrifty.profile_bundle/1", "kind": "compute", "model": "resnet50",
                                "profiles": {instance_type: profile_dict(model="resnet50", device=device)}}))
    return path


def test_a_profile_bundle_is_measured_and_a_type_it_lacks_is_a_fallback(tmp_path):
    library = ModelLibrary()
    bundle = _bundle(tmp_path / "bundle.json", "A10G", "g5.xlarge")
    library.add_file(bundle)
    own = library.source_of("resnet50", "A10G", "g5.xlarge")
    assert (own.kind, own.file, own.fallback) == ("derived", str(bundle.resolve()), False)  # the profile's own record
    carried = library.source_of("resnet50", "A10G", "g5.12xlarge")  # the same device: the bundle's profile
    assert carried.file == str(bundle.resolve())
    assert carried.note == "measured on g5.xlarge, a type of the same device (A10G)"
    other = library.source_of("resnet50", "T4", "g4dn.xlarge")  # no profile of it in the bundle: the shipped one
    assert other.fallback and other.file == "datasets/profiles/derived/resnet50__T4.json"
    assert other.passed_over == [f"the profile bundle {bundle.resolve()} has no profile of g4dn.xlarge"]


def test_a_model_corrected_online_says_so_with_its_prior():
    """The hook of online calibration: a corrected compute model, added to the
    library with a record of kind "corrected", is reported as corrected."""
    prior = profile_dict(model="m", device="cpu")
    record = {"kind": "corrected", "notes": "2 segments, 40 iterations", "prior": prior["provenance"]}
    model = ComputeModel.from_profile(ComputeProfile.model_validate(prior))
    library = ModelLibrary(paths=[])
    library.add(dataclasses.replace(model, provenance=record))
    source = library.source_of("m", "cpu", "local")
    assert (source.kind, source.note, source.prior.kind, source.prior.script) == (
        "corrected", "2 segments, 40 iterations", "derived", "tests/helpers.py")
    assert source.describe() == "corrected online (2 segments, 40 iterations) from derived (tests/helpers.py)"


# -- tuning plans: the scaling profile, and the SCALE and INIT latencies ---------------------------------------

def _scaling_bundle(path: Path) -> Path:
    point = {"gpus": 1, "iteration_s": 0.5, "iteration_sd_s": 0.01}
    document = {"format": "thrifty.scaling_profile/1", "model": "m", "instance_type": "local-a", "points": [point],
                "provenance": {"kind": "measured", "command": "thrifty profile-scaling ...", "machine": "here"}}
    machines = {"count": 1, "scale_latency_s": 2.0, "init_latency_s": 3.0, "launch_to_ready_s": 5.0,
                "machine_s": 9.0, "usd_per_hour": 0.4, "cost_usd": 0.001}
    path.write_text(json.dumps({"format": "thrifty.profile_bundle/1", "kind": "scaling", "model": "m",
                                "profiles": {"local-a": document}, "machines": {"local-a": machines}}))
    return path


def test_a_tuning_plan_says_where_its_profile_and_its_scale_and_init_latencies_came_from(tmp_path):
    bundle = _scaling_bundle(tmp_path / "scaling.json")
    tuning = {"kind": "tuning", "model": str(bundle), "instance_type": "local-a", "catalog": str(DEMO_CATALOG),
              "deadline_s": 3600, "samples": 10, "cloud": {"init_latency_s": 7},
              "experiment": {"algorithm": "sha", "trials": 2, "min_iters": 1, "max_iters": 2, "eta": 2}}
    provenance = TuningSpace(parse_problem(tuning)).provenance()["local-a"]
    assert (provenance.scale_latency.kind, provenance.scale_latency.seconds, provenance.scale_latency.file) == (
        "measured", 2.0, str(bundle.resolve()))  # the launch-to-ready time profile-scaling --cluster measured
    assert (provenance.init_latency.kind, provenance.init_latency.seconds) == ("stated", 7.0)
    assert (provenance.compute.kind, provenance.compute.machine) == ("measured", "here")
    assert provenance.allreduce.kind == "measured" and "include the gradient exchange" in provenance.allreduce.note
    shipped = parse_problem(json.loads((EXAMPLES / "rubberband-sha32-resnet101.json").read_text()))
    p3 = TuningSpace(shipped).provenance()["p3.8xlarge"]
    assert p3.compute.kind == "derived" and p3.compute.file == "datasets/profiles/scaling/resnet101__p3.8xlarge.json"
    rescaled = TuningSpace(parse_problem({**tuning, "profile": {"base_iteration_s": 1.5}})).provenance()
    assert rescaled["local-a"].compute.kind == "stated" and rescaled["local-a"].compute.prior.kind == "measured"


# -- validate --device cuda: the type it runs on ------------------------------------------------------------

def test_validate_on_cuda_picks_the_catalog_type_of_the_host_gpus():
    from thrifty.runtime.commands.validate import host_instance_type

    catalog = load_catalog()
    chosen = {args: getattr(host_instance_type(catalog, *args), "name", None)
              for args in [("H100", 1, 1), ("A10G", 1, 1), ("A10G", 4, 2), ("A10G", 2, 2), ("V100", 4, 4),
                           ("MI300X", 8, 2), ("T4", 1, 8)]}
    assert chosen == {("H100", 1, 1): "p5.48xlarge", ("A10G", 1, 1): "g5.xlarge", ("A10G", 4, 2): "g5.12xlarge",
                      ("A10G", 2, 2): "g5.12xlarge", ("V100", 4, 4): "p3.8xlarge", ("MI300X", 8, 2): None,
                      ("T4", 1, 8): None}


def test_validate_on_cuda_prices_the_exchange_with_the_model_of_that_type():
    from thrifty.runtime.commands.validate import _parse_config, _predict

    model = ComputeModel.from_profile(ComputeProfile.model_validate(
        profile_dict(model="m", device="T4", layers=((4_000_000, 0.5), (4_000_000, 1.0)))))
    [prediction], sources, provenance = _predict(model, [_parse_config("4xlocal@8")], "T4", None, gpus=4)
    assert sources == {"local": "derived"}
    assert provenance["local"]["kind"] == "derived" and not provenance["local"]["fallback"]
    assert "priced as one g4dn.12xlarge" in provenance["local"]["note"]
    # the exchange is that of one g4dn.12xlarge machine of 4 T4s, not of 4 machines on local's 10 Gbit/s
    library = ModelLibrary(paths=[])
    library.add(model)
    one = IterationSimulator("m", library=library, bandwidth=default_bandwidth_model()).simulate(
        [MachineGroup(load_catalog().get("g4dn.12xlarge"), 1, 32)])
    assert prediction.exchange_s == pytest.approx(one.exchange_s, rel=1e-9) and one.exchange_s > 0
    [h100], _, said = _predict(dataclasses.replace(model, device="H100"), [_parse_config("2xlocal@8")], "H100",
                               None, gpus=8)
    assert said["local"]["kind"] == "analytic" and said["local"]["fallback"]
    assert "priced as one p5.48xlarge" in said["local"]["note"]


def test_validate_on_a_gpu_no_type_has_says_it_cannot_price_communication():
    from thrifty.runtime.commands.validate import _parse_config, _predict

    model = ComputeModel.from_profile(ComputeProfile.model_validate(profile_dict(model="m", device="MI300X")))
    with pytest.raises(ProblemError, match="cannot price communication on this host's MI300X GPUs"):
        _predict(model, [_parse_config("2xlocal@8")], "MI300X", None, gpus=2)
    [alone], sources, provenance = _predict(model, [_parse_config("local@8")], "MI300X", None, gpus=1)
    assert alone.exchange_s == 0 and sources == {} and provenance == {}  # one rank exchanges nothing


# -- what thrifty run and thrifty tune print of their plan -----------------------------------------------------

def test_run_dry_run_says_where_a_plans_figures_came_from_also_for_a_plan_that_does_not(tmp_path, capsys,
                                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    problem = str(EXAMPLES / "local-demo-srifty54.json")
    plan = {"kind": "training", "status": "feasible", "objective": "min_cost",  # by hand: no provenance
            "allocation": [{"instance_type": "local-a", "market": "spot", "count": 2, "batch_per_instance": 32}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    zoo = ["--trainer", "thrifty.runtime.training.examples:zoo"]
    assert main(["run", "plan.json", "--problem", problem, "--dry-run", "--json", *zoo]) == 0
    said = json.loads(capsys.readouterr().out)["provenance"]  # from the problem's models, for each of its types
    assert set(said) == {"local-a", "local-b"} and said["local-a"]["allreduce"]["kind"] == "measured"
    # (a solved plan's own provenance, in words too: tests/test_cli.py's dry run)


def test_tune_dry_run_of_a_plan_says_where_its_profile_and_latencies_came_from(tmp_path, capsys):
    profile = tmp_path / "profile.json"  # a scaling profile that does not say where it came from
    profile.write_text(json.dumps({"format": "thrifty.scaling_profile/1", "model": "example",
                                   "instance_type": "local-a", "points": [{"gpus": 1, "iteration_s": 0.05}]}))
    experiment = {"name": "small", "trainer": "thrifty.runtime.tuning.executors.worlds:example_trainer",
                  "search_space": {"lr": {"loguniform": [0.003, 0.5]}, "hidden": {"choice": [4, 16]}},
                  "samples": 4, "seed": 1,
                  "max_iterations": 4, "scheduler": {"name": "plan"}, "deadline_s": 120,
                  "resources": {"instance_type": "local-a", "catalog": str(DEMO_CATALOG), "max_instances": 2,
                                "model": str(profile)}}
    (tmp_path / "exp.json").write_text(json.dumps(experiment))
    assert main(["tune", str(tmp_path / "exp.json"), "--dry-run"]) == 0
    shown = capsys.readouterr().out
    assert f"local-a compute: stated ({profile})" in shown
    assert "local-a SCALE latency 0 s default, INIT latency 0 s default" in shown
