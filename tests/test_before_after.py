"""``benchmarks/before_after.py`` measures two checkouts with one script:
the names a refactor moves are looked up at their new home first, then at
their old one, and every name its measures use is found in this checkout (a
rename that the script does not know fails here, not half way through a
comparison)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers import load_script

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def script():
    return load_script(ROOT / "benchmarks" / "before_after.py")


def test_resolve_takes_the_first_name_this_checkout_has(script):
    from thrifty.solver import solve

    assert script.resolve("thrifty.solver.no_such_module:solve", "thrifty.solver:no_such_name",
                          "thrifty.solver:solve") is solve
    assert script.resolved_name("thrifty.runtime.no_such_package.zoo:zoo", "thrifty.solver:solve") == \
        "thrifty.solver:solve"


def test_resolve_names_every_name_it_tried_when_none_is_here(script):
    with pytest.raises(LookupError, match="thrifty.old:a, thrifty.solver:b"):
        script.resolve("thrifty.old:a", "thrifty.solver:b")


def test_a_dependency_missing_inside_a_module_is_an_error_not_a_name_to_skip(script, monkeypatch):
    def import_module(name):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(script.importlib, "import_module", import_module)
    with pytest.raises(ModuleNotFoundError, match="torch"):
        script.resolve("thrifty.runtime.training.replan:Replanner", "thrifty.solver:solve")


def test_every_name_the_measures_use_is_in_this_checkout(script):
    for names in (script.TRIAL_EXECUTORS, script.EXAMPLE_TRAINERS, ("thrifty.runtime.training.replan:Replanner",),
                  ("thrifty.runtime.training:train",), ("thrifty.runtime.training:RunConfig",),
                  ("thrifty.runtime.training.examples:zoo",), ("thrifty.runtime.tuning.trial:Report",),
                  ("thrifty.runtime.tuning.trial:Trial",)):
        assert callable(script.resolve(*names)), names
    assert set(script.UNITS) == set(script.MEASURES)
    assert all(callable(getattr(script, f"measure_{m}")) for m in script.MEASURES)


@pytest.mark.parametrize("argv, said", [
    (["--before", sys.executable, "--only", "replan,iteration_gpu"], "iteration_gpu is not a measure"),
    (["--before", sys.executable, "--rounds", "0"], "--rounds is 0, but must be at least 1"),
    ([], "give --before PYTHON"),
])
def test_bad_arguments_are_a_usage_error(script, monkeypatch, capsys, argv, said):
    monkeypatch.setattr(sys, "argv", ["before_after.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        script.main()
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err
