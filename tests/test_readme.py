"""The README's first commands are what a newcomer types, and `.ci/run` runs
exactly them in a fresh virtualenv: CI is green only if a fresh install is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _first_block_after(text: str, heading: str) -> str:
    """The first fenced code block after the line that starts with `heading`."""
    start = text.index(heading)
    match = re.search(r"```[^\n]*\n(.*?)```", text[start:], re.S)
    assert match, f"no code block after {heading!r} in README.md"
    return match.group(1).strip()


def test_ci_runs_the_readme_install_and_test_commands_in_a_fresh_venv():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install = _first_block_after(readme, "Install")
    test = _first_block_after(readme, "Run the tests")
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    commands = [line for line in ci_lines if line and not line.startswith("#")]
    assert install in commands, f"{install!r} (README) is not a command of .ci/run"
    assert test in commands, f"{test!r} (README) is not a command of .ci/run"
    assert commands.index(install) < commands.index(test)
    venv = next(i for i, c in enumerate(commands) if "-m venv" in c)
    activate = next(i for i, c in enumerate(commands) if c.startswith(". ") and "activate" in c)
    assert venv < activate < commands.index(install), ".ci/run must install into a venv it makes"


def test_the_readme_main_job_finds_a_heterogeneous_plan_and_its_second_example_is_infeasible(capsys, monkeypatch):
    import json
    import shlex

    from thrifty.runtime.cli import main

    monkeypatch.chdir(ROOT)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = shlex.split(_first_block_after(readme, "Run the main job"))
    assert command[:2] == ["thrifty", "solve"]
    assert main(command[1:] + ["--json"]) == 0  # a newcomer's first command succeeds
    plan = json.loads(capsys.readouterr().out)
    assert plan["status"] == "optimal"
    assert len({a["instance_type"] for a in plan["allocation"]}) > 1, "the main job shows a heterogeneous plan"
    second = shlex.split(_first_block_after(readme, "A second example"))
    assert main(second[1:]) == 3  # infeasible, with the reason
    assert "raise limits" in capsys.readouterr().out
