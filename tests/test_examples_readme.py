"""datasets/examples/README.md says what the shipped problems, profiles and
solver give now: a change that moves a case study's plan must regenerate it
(``python datasets/scripts/make_examples_readme.py``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "datasets" / "scripts" / "make_examples_readme.py"


def load_script():
    spec = importlib.util.spec_from_file_location("make_examples_readme", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_readme_is_what_its_script_writes_now():
    script = load_script()
    stale = script.stale_lines((ROOT / "datasets" / "examples" / "README.md").read_text(), script.render())
    assert not stale, ("datasets/examples/README.md is stale; run python datasets/scripts/make_examples_readme.py\n"
                       + "\n".join(stale))


def test_the_check_sees_a_changed_row_but_not_a_changed_solve_time():
    script = load_script()
    text = "| a | min_time | x | y | 2xg3@8 | 1.0 s/iter | 0.05 s |\n"
    assert script.stale_lines(text, text.replace("0.05 s", "0.31 s")) == []
    assert script.stale_lines(text, text.replace("2xg3@8", "4xg3@4"))
