"""The shipped scaling profiles are exactly what their script derives.

`datasets/profiles/scaling/*.json` are derived by
`datasets/scripts/derive_scaling_profiles.py`; regenerating them into a
temporary folder must reproduce every shipped file, value for value, and
every file must load as a valid `ScalingProfile`. The file format is the
schema `ScalingProfileFile`: a shipped file loads and dumps to the same data,
and a bad field is named by its JSON path (also through the CLI, exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrifty.core.errors import ProblemError
from thrifty.core.validation import validate_model
from thrifty.perfmodels.scaling import ScalingProfileFile, load_scaling_profile, parse_scaling_profile
from thrifty.runtime.cli import main

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "datasets" / "scripts" / "derive_scaling_profiles.py"
SHIPPED = ROOT / "datasets" / "profiles" / "scaling"


def _script():
    return load_script(SCRIPT)


def test_regenerating_reproduces_every_shipped_file(tmp_path):
    written = _script().derive(tmp_path)
    shipped = sorted(p.name for p in SHIPPED.glob("*.json"))
    assert sorted(p.name for p in written) == shipped
    for path in written:
        assert json.loads(path.read_text()) == json.loads((SHIPPED / path.name).read_text()), path.name


def test_every_shipped_scaling_profile_loads_and_says_it_is_derived():
    for path in SHIPPED.glob("*.json"):
        profile = load_scaling_profile(str(path), "")
        doc = json.loads(path.read_text())
        assert doc["provenance"]["kind"] == "derived"
        assert "derive_scaling_profiles.py" in doc["provenance"]["script"]
        means = [profile.iteration(g)[0] for g in (1, 2, 4, 8)]
        assert all(m > 0 for m in means)


@pytest.mark.parametrize("path", sorted(SHIPPED.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_file_round_trips_through_its_schema(path):
    data = json.loads(path.read_text())
    assert validate_model(ScalingProfileFile, data, source=str(path)).to_json() == data


# -- a bad field is named by its JSON path: one test per rule ---------------------------


def _shipped(name: str = "resnet50__p3.8xlarge.json") -> dict:
    return json.loads((SHIPPED / name).read_text())


def _with(data: dict, loc: tuple, value) -> dict:
    *parents, last = loc
    inner = data
    for key in parents:
        inner = inner[key]
    inner[last] = value
    return data


@pytest.mark.parametrize("loc,value,path,message", [
    (("points", 0, "gpus"), 2, "points[0].gpus", "is 2, but a profile must start at 1 GPU"),
    (("points", 3, "gpus"), 4, "points[3].gpus", "is 4, but GPU counts must increase (points[2].gpus is 4)"),
    (("points", 1, "iteration_s"), 0, "points[1].iteration_s", "is 0, but must be greater than 0"),
    (("points", 2, "iteration_s"), "fast", "points[2].iteration_s", "input should be a valid number"),
    (("points", 4, "iteration_sd_s"), -0.1, "points[4].iteration_sd_s", "is -0.1, but must be at least 0"),
    (("startup_s",), 1e6, "startup_s", "is 1e+06, but must be at most 86400"),
    (("batch",), 0, "batch", "is 0, but must be greater than 0"),
    (("format",), "thrifty.scaling_profile/0", "format", "input should be 'thrifty.scaling_profile/1'"),
    (("start_up_s",), 1.0, "start_up_s", "is not a known field"),
    (("provenance", "kind"), "guessed", "provenance.kind", "input should be 'measured', 'published' or 'derived'"),
    (("points",), [], "points", "list should have at least 1 item"),
])
def test_a_bad_field_is_named_by_its_path(loc, value, path, message):
    with pytest.raises(ProblemError) as e:
        parse_scaling_profile(_with(_shipped(), loc, value), "bad.json")
    assert (e.value.source, e.value.path) == ("bad.json", path)
    assert e.value.message.startswith(message), e.value.message


def test_a_missing_field_is_named_by_its_path():
    data = _shipped()
    del data["points"][1]["gpus"]
    with pytest.raises(ProblemError) as e:
        parse_scaling_profile(data, "bad.json")
    assert (e.value.path, e.value.message) == ("points[1].gpus", "is required but missing")


def test_a_file_without_provenance_or_sd_loads_with_the_defaults():
    profile = parse_scaling_profile({"format": "thrifty.scaling_profile/1", "model": "toy", "instance_type": "box",
                                     "points": [{"gpus": 1, "iteration_s": 1.0}, {"gpus": 2, "iteration_s": 0.6}]},
                                    "toy.json")
    assert (profile.gpus, profile.iteration_s, profile.iteration_sd_s) == ((1, 2), (1.0, 0.6), (0.0, 0.0))
    assert (profile.startup_s, profile.batch, profile.source) == (0.0, None, "toy.json")


def test_cli_names_the_bad_field_of_a_tuning_problems_profile_and_exits_2(tmp_path, capsys):
    profile = tmp_path / "bad__p3.8xlarge.json"
    profile.write_text(json.dumps(_with(_shipped(), ("points", 2, "iteration_sd_s"), -1)))
    problem = tmp_path / "tuning.json"
    problem.write_text(json.dumps({
        "kind": "tuning", "experiment": {"algorithm": "sha", "trials": 8, "min_iters": 1, "max_iters": 9, "eta": 3},
        "model": str(profile), "instance_type": "p3.8xlarge", "deadline_s": 1200}))
    assert main(["solve", str(problem)]) == 2
    err = capsys.readouterr().err
    assert f"{profile}: points[2].iteration_sd_s: is -1, but must be at least 0" in err
    assert "Traceback" not in err
