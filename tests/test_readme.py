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


# the README's user-loop example, on a copy of its problem whose job trains on tiny images (the same file, loop
# and iterations; a smaller data set through job_args), so the three commands cost a few seconds of CPU
TINY_IMAGES = {"samples": 64, "held_out": 16, "size": 8, "channels": 2, "width": 4, "classes": 3}


def test_the_readme_run_section_leads_with_the_user_loop_example_and_its_commands_work(tmp_path, capsys,
                                                                                       monkeypatch):
    import json
    import shlex

    from thrifty.runtime.cli import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("THRIFTY_PROFILE_CACHE", str(tmp_path / "profiles"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = _first_block_after(readme, "### `thrifty run")
    commands = [shlex.split(line) for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    assert [c[:2] for c in commands] == [["thrifty", "profile"], ["thrifty", "solve"], ["thrifty", "run"]]
    problem_path = "datasets/examples/cnn-job.json"
    assert all(c[2] == problem_path for c in commands), "each command takes the example problem"
    assert any(word.startswith("kill:") for word in commands[2]), "the run injects a preemption"
    problem = json.loads((ROOT / problem_path).read_text())
    job = problem["job"]
    assert job.split(":")[0].endswith(".py") and "job_args" not in problem, "the job is the file, with its defaults"
    copy = tmp_path / "cnn-job.json"
    copy.write_text(json.dumps({**problem, "job": str((ROOT / problem_path).parent / job),
                                "catalog": str((ROOT / problem_path).parent / problem["catalog"]),
                                "job_args": TINY_IMAGES}))
    cheap = {"profile": ["--repeats", "2", "--warmup", "1", "--rounds", "1", "--no-progress"],
             "solve": ["--json"], "run": ["--out", str(tmp_path / "run"), "--no-progress"]}
    outputs = {}
    for command in commands:
        capsys.readouterr()
        assert main([command[1], str(copy), *command[3:], *cheap[command[1]]]) == 0, command
        outputs[command[1]] = capsys.readouterr().out
    from thrifty.perfmodels.job_profiles import job_key, profile_path
    from thrifty.perfmodels.profile import load_profile

    # `thrifty profile PROBLEM.json` timed the problem's job, with its arguments, at its batch sizes
    profile = load_profile(profile_path(job_key(str((ROOT / problem_path).parent / job), TINY_IMAGES), device="cpu"))
    assert [point.batch for point in profile.points] == problem["batch_sizes"]
    plan = json.loads(outputs["solve"])  # priced by the profile the first command measured of the job itself
    assert plan["status"] == "optimal"
    assert {p["compute"]["kind"] for p in plan["provenance"].values()} == {"measured"}
    events = [json.loads(line) for line in (tmp_path / "run" / "run.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert "preemption" in kinds and "replan" in kinds and kinds[-1] == "finish", kinds
    assert events[0]["trainer"] == str((ROOT / problem_path).parent / job)  # the problem's job ran
    assert events[-1]["iterations"] == problem["iterations"]
