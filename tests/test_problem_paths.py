"""Relative file fields of a problem file (``catalog``, ``allreduce``, ``model``
naming a profile file) are read from the problem file's folder, whatever the
current folder; a file that is not there is named with the problem file and the
field; a problem built in Python reads them from the current folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from thrifty.core.errors import ProblemError
from thrifty.runtime.cli import main
from thrifty.solver import solve
from thrifty.solver.problem import load_problem

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "datasets" / "examples" / "heterogeneous-resnet50.json"
CATALOG = ROOT / "datasets" / "catalog" / "aws-us-east-1.json"
LOCAL_MODEL = ROOT / "datasets" / "allreduce" / "local-gloo-model.json"
PROFILE = ROOT / "datasets" / "profiles" / "derived" / "resnet50__T4.json"
SMALL = {"kind": "training", "model": "resnet50", "global_batch": 256, "iterations": 100,
         "instances": [{"instance_type": "g4dn.xlarge", "market": "spot", "quota": 2}]}


def _plan(argv: list[str], capsys) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_an_example_solves_the_same_from_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    here = _plan(["solve", str(EXAMPLE.relative_to(ROOT)), "--json"], capsys)
    monkeypatch.chdir(tmp_path)
    there = _plan(["solve", str(EXAMPLE), "--json"], capsys)
    for plan in (here, there):
        plan["solver"].pop("wall_s")
    assert here == there


def test_a_copied_problem_whose_catalog_is_gone_names_the_file_and_the_field(tmp_path, monkeypatch, capsys):
    shutil.copy(EXAMPLE, tmp_path / "copy.json")
    monkeypatch.chdir(tmp_path)
    assert main(["solve", "copy.json"]) == 2
    assert capsys.readouterr().err.strip() == (
        "thrifty solve: error: copy.json: catalog: file not found: ../catalog/aws-us-east-1.json")


@pytest.mark.parametrize("field, value", [("allreduce", "models/mine.json"), ("model", "profiles/mine.json")])
def test_every_file_field_that_is_missing_is_named(tmp_path, capsys, field, value):
    problem = tmp_path / "jobs" / "p.json"
    problem.parent.mkdir()
    problem.write_text(json.dumps({**SMALL, field: value}))
    assert main(["solve", str(problem)]) == 2
    where = problem.parent / value
    assert capsys.readouterr().err.strip() == f"thrifty solve: error: {problem}: {field}: file not found: {where}"


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_files_next_to_the_problem_are_found_from_another_folder(tmp_path, monkeypatch, capsys, suffix):
    """A catalog named without a folder or a .json suffix, a learned allreduce model and a profile file,
    all beside the problem file (JSON or YAML), read with the current folder elsewhere."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    shutil.copy(CATALOG, jobs / "my-catalog")
    shutil.copy(LOCAL_MODEL, jobs / "allreduce.json")
    shutil.copy(PROFILE, jobs / "resnet50-mine__T4.json")
    data = {**SMALL, "catalog": "my-catalog", "allreduce": "allreduce.json", "model": "resnet50-mine__T4.json"}
    problem = jobs / f"p{suffix}"
    problem.write_text(json.dumps(data))  # JSON is YAML
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_problem(problem)
    assert (loaded.catalog, loaded.allreduce, loaded.model) == (
        str(jobs / "my-catalog"), str(jobs / "allreduce.json"), str(jobs / "resnet50-mine__T4.json"))
    plan = _plan(["solve", str(problem), "--json"], capsys)
    assert plan["status"] == "optimal" and plan["allocation"][0]["instance_type"] == "g4dn.xlarge"


def test_a_problem_built_in_python_reads_its_files_from_the_current_folder(tmp_path, monkeypatch):
    shutil.copy(CATALOG, tmp_path / "cat.json")
    monkeypatch.chdir(tmp_path)
    assert solve({**SMALL, "catalog": "cat.json"}).status == "optimal"
    with pytest.raises(ProblemError) as e:
        solve({**SMALL, "catalog": "../cat.json"})
    assert (e.value.source, e.value.path, e.value.message) == (None, "catalog", "file not found: ../cat.json")
