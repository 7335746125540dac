"""Profile bundles (`thrifty.perfmodels.bundle`: one profile per instance
type, what ``thrifty profile --cluster`` and ``profile-scaling --cluster``
write) as problems name them, and the bad input of those commands, which is
refused before any cluster is reached. (The commands themselves run on
clusters in test_cluster_ray.py and test_cluster_ec2.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrifty.core.errors import ProblemError
from thrifty.datasets.catalog import load_catalog
from thrifty.perfmodels.cluster import MachineGroup
from thrifty.perfmodels.bundle import load_bundle, scaling_profile_of
from thrifty.perfmodels.library import ModelLibrary
from thrifty.runtime.cli import main
from thrifty.solver.problem import parse_problem
from thrifty.solver.training import TrainingSpace

from helpers import profile_dict

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "datasets" / "examples" / "local-demo-catalog.json"
MLP = "thrifty.runtime.measure.zoo:mlp"


def machine(cost: float = 0.001) -> dict:
    return {"count": 1, "scale_latency_s": 2.0, "init_latency_s": 3.0, "launch_to_ready_s": 5.0,
            "machine_s": 9.0, "usd_per_hour": cost * 400, "cost_usd": cost}


def compute_bundle(path: Path, profiles: dict[str, dict]) -> Path:
    path.write_text(json.dumps({"format": "thrifty.profile_bundle/1", "kind": "compute", "model": "m",
                                "market": "spot", "profiles": profiles,
                                "machines": {name: machine() for name in profiles}, "total_cost_usd": 0.002}))
    return path


def test_each_type_of_a_bundle_is_priced_with_its_own_profile_though_they_share_a_device(tmp_path):
    slow, fast = profile_dict(device="cpu", fw=(0.05, 0.01)), profile_dict(device="cpu", fw=(0.01, 0.001))
    path = compute_bundle(tmp_path / "b.json", {"local-a": slow, "local-b": fast})
    problem = parse_problem({"kind": "training", "model": str(path), "global_batch": 8, "iterations": 10,
                             "catalog": str(CATALOG), "instances": [
                                 {"instance_type": "local-a", "market": "spot", "quota": 1},
                                 {"instance_type": "local-b", "market": "spot", "quota": 1}]})
    space = TrainingSpace(problem)
    catalog = load_catalog(CATALOG)
    a, b = (space.simulator.compute_model(catalog.get(name)) for name in ("local-a", "local-b"))
    assert a.forward_s(8) == pytest.approx(0.05 + 0.08) and b.forward_s(8) == pytest.approx(0.01 + 0.008)
    # the simulator keeps them apart too: one machine of each, alone, predicts each one's forward pass
    groups = {name: space.simulator.simulate([MachineGroup(catalog.get(name), 1, 8)])
              for name in ("local-a", "local-b")}
    assert groups["local-a"].forward_s == pytest.approx(0.13) and groups["local-b"].forward_s == pytest.approx(0.018)


def test_a_device_one_type_of_a_bundle_has_carries_to_the_other_types_of_that_device(tmp_path):
    path = compute_bundle(tmp_path / "b.json", {"p3.2xlarge": profile_dict(device="V100", fw=(0.5, 0.0))})
    library = ModelLibrary(paths=[])
    library.add_file(path)
    assert library.get("m", "V100", "p3.8xlarge").forward_s(4) == pytest.approx(0.5)
    shared = compute_bundle(tmp_path / "c.json", {"local-a": profile_dict(device="cpu"),
                                                  "local-b": profile_dict(device="cpu")})
    library = ModelLibrary(paths=[tmp_path / "m__cpu.json"])
    (tmp_path / "m__cpu.json").write_text(json.dumps(profile_dict(device="cpu")))
    library.add_file(shared)
    # two types measured 'cpu' differently: neither speaks for a third, nor does another profile of 'cpu'
    with pytest.raises(ProblemError, match="holds profiles of local-a, local-b on device 'cpu'.*none of local"):
        library.get("m", "cpu", "local")


def test_a_bad_bundle_names_the_json_path_of_what_is_wrong(tmp_path):
    path = compute_bundle(tmp_path / "b.json", {"local-a": profile_dict(model="other", device="cpu")})
    with pytest.raises(ProblemError, match=r'profiles\["local-a"\]\.model: is \'other\''):
        load_bundle(path)


def test_a_tuning_problem_names_a_scaling_bundle_and_a_type_it_lacks_is_named(tmp_path):
    point = {"gpus": 1, "iteration_s": 0.5, "iteration_sd_s": 0.01}
    document = {"format": "thrifty.scaling_profile/1", "model": "m", "instance_type": "local-a", "points": [point]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"format": "thrifty.profile_bundle/1", "kind": "scaling", "model": "m",
                                "profiles": {"local-a": document}, "machines": {"local-a": machine()}}))
    profile, measured = scaling_profile_of(str(path), "local-a")
    assert profile.iteration(1) == (0.5, 0.01) and measured is not None and measured.init_latency_s == 3.0
    with pytest.raises(ProblemError, match="has no profile of local-b; it has local-a") as error:
        scaling_profile_of(str(path), "local-b")
    assert error.value.path == "model"


@pytest.mark.parametrize("command", [["profile", MLP], ["profile-scaling", MLP, "--world-sizes", "1", "--batch", "2"]])
@pytest.mark.parametrize("options, words", [
    (["--market", "spot"], "--market needs --cluster"),
    (["--instance-types", "local-a"], "--instance-types needs --cluster"),
    (["--cluster", "127.0.0.1:1"], "--cluster needs --instance-types"),
    (["--cluster", "127.0.0.1:1", "--instance-types", "local-z", "--catalog", str(CATALOG)],
     "unknown instance type 'local-z'"),
    (["--cluster", "127.0.0.1:1", "--instance-types", "local-a", "--device", "cpu"], "leave them out"),
    (["--market", "spot", "--catalog", str(CATALOG)], "--market and --catalog need --cluster"),
])
def test_bad_cluster_options_are_a_one_line_error_before_any_cluster_is_reached(command, options, words, tmp_path,
                                                                              capsys):
    assert main([*command, *options, "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert not (tmp_path / "out.json").exists()
