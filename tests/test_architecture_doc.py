"""The project's architecture document (``docs/architecture.md``) stays true
to the code, and the project cites its own files only: no file of the
repository cites the design document kept beside it (issue 34); the plan
JSON keys and the exit codes the document lists are the models' and the
command line's; every repository path it names exists; each "where to
change" question is answered by at most 3 files."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from thrifty.runtime.commands._args import EXIT_CODES
from thrifty.solver.plan import (Allocation, FigureProvenance, Infeasibility, LatencyProvenance, Plan, PlanRecord,
                                 Prediction, SolverInfo, TypeProvenance)
from thrifty.solver.tuning_plan import TuningBaseline, TuningPlan, TuningPrediction, TuningSolverInfo, TuningStage

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
# what is not the repository's own text: tool caches, environments, build outputs and run folders (.gitignore)
NOT_SOURCE = {".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis",
              "build", "dist", "thrifty-runs", ".helper-notes"}
# the rows of the plan-keys table, and the model whose JSON each lists
PLAN_MODELS: dict[str, type[PlanRecord]] = {
    "training plan": Plan, "training plan allocation[]": Allocation, "training plan predicted": Prediction,
    "training plan solver": SolverInfo, "infeasibility (both kinds)": Infeasibility, "tuning plan": TuningPlan,
    "tuning plan stages[]": TuningStage, "tuning plan predicted": TuningPrediction,
    "tuning plan baselines.*": TuningBaseline, "tuning plan solver": TuningSolverInfo,
    "provenance.TYPE (both kinds)": TypeProvenance, "provenance.TYPE.compute, .allreduce": FigureProvenance,
    "provenance.TYPE.scale_latency, .init_latency (tuning)": LatencyProvenance}


def repository_files() -> list[Path]:
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in NOT_SOURCE and not d.endswith(".egg-info")]
        out += [Path(folder) / name for name in files]
    return sorted(out)


def doc_text() -> str:
    return DOC.read_text()


def table(marker: str) -> list[list[str]]:
    """The cells of each body row of the table between ``<!-- MARKER`` and ``<!-- end MARKER -->``."""
    text = doc_text()
    start = text.index(f"<!-- {marker}")
    body = text[start:text.index(f"<!-- end {marker} -->", start)]
    rows = []
    for line in body.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            rows.append(cells)
    return rows[1:]  # the header row left out


def test_no_file_of_the_repository_cites_the_design_document_beside_it():
    needle = re.compile(r"\bDESIGN(\.md)?\b")
    files = [p for p in repository_files() if p != Path(__file__).resolve()]
    assert len(files) > 100
    bad = []
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:  # images and other binary files
            continue
        bad += [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                if needle.search(line)]
    assert not bad, "cite docs/architecture.md instead:\n" + "\n".join(bad)


def json_keys(model: type[PlanRecord]) -> list[tuple[str, bool]]:
    """The JSON keys a plan model writes, in order, each with whether it is written only when set."""
    return [(info.alias or name, (info.alias or name) in model._omit_empty)
            for name, info in model.model_fields.items()]


def test_the_plan_keys_the_document_lists_are_the_plan_models_keys_in_their_order():
    rows = {" ".join(cells[0].replace("`", "").split()): cells[1] for cells in table("plan keys")}
    assert set(rows) == set(PLAN_MODELS)
    for name, model in PLAN_MODELS.items():
        listed = re.sub(r"\s*\([^)]*\)", "", rows[name])  # "`kind` (`"training"`)": the key alone
        keys = [(key, star == "*") for key, star in re.findall(r"`([A-Za-z_0-9]+)`(\*?)", listed)]
        assert keys == json_keys(model), f"{name}: the document lists {keys}, the model writes {json_keys(model)}"


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9-]+", text.lower()))


def test_the_exit_codes_the_document_lists_are_the_command_lines():
    rows = {int(cells[0]): cells[1] for cells in table("exit codes")}
    assert set(rows) == set(EXIT_CODES)
    for code, meaning in EXIT_CODES.items():
        assert words(meaning) <= words(rows[code]), f"exit code {code}: {rows[code]!r} does not say {meaning!r}"


def test_every_repository_path_the_document_names_exists():
    named = set(re.findall(r"`((?:core|datasets|perfmodels|solver|runtime|tests|benchmarks|docs)/[\w./-]*)`",
                           doc_text()))
    assert len(named) > 20
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def where_to_change() -> dict[str, set[str]]:
    """Each question of "Where to change the common things" (its bold lead)
    with the repository files its answer names."""
    text = doc_text()
    start = text.index("## Where to change the common things")
    section = text[start:text.index("\n## ", start + 1)]
    answers = {}
    for paragraph in section.split("\n\n"):
        lead = re.match(r"\*\*(.+?)\*\*", paragraph.strip())
        if lead:
            answers[lead.group(1)] = set(re.findall(r"`((?:core|datasets|perfmodels|solver|runtime)/[\w/.-]+\.py)`",
                                                    paragraph))
    return answers


@pytest.mark.parametrize("question", ["A spot notice's handling.", "The CP-SAT formulation.",
                                      "How a trial reaches a node."])
def test_each_where_to_change_question_is_answered_by_at_most_three_files(question: str):
    files = where_to_change()[question]
    assert 1 <= len(files) <= 3, f"{question}: {sorted(files)}"
    assert all((ROOT / f).is_file() for f in files), sorted(files)
