"""The command line behaves as Unix tools do: a closed pipe ends quietly,
YAML problem files work wherever JSON ones do, written files follow the
umask, and errors name the bad field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from thrifty.core.io import write_json
from thrifty.runtime.cli import EXIT_CLOSED_PIPE, main

EXAMPLES = Path(__file__).resolve().parents[1] / "datasets" / "examples"


def test_a_closed_pipe_ends_quietly() -> None:
    # `thrifty schema training | head -c 1`: the reader leaves before the output is written
    proc = subprocess.Popen([sys.executable, "-m", "thrifty.runtime.cli", "schema", "training"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == EXIT_CLOSED_PIPE
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def _as_yaml(example: str, folder: Path) -> Path:
    doc = json.loads((EXAMPLES / example).read_text())
    for key in ("catalog", "allreduce", "model"):  # relative paths resolve against the file's folder
        if isinstance(doc.get(key), str) and (EXAMPLES / doc[key]).is_file():
            doc[key] = str((EXAMPLES / doc[key]).resolve())
    path = folder / (Path(example).stem + ".yaml")
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("example", ["srifty-case1-resnet50.json", "rubberband-sha32-resnet101.json"])
def test_yaml_problems_solve_like_json(example: str, tmp_path: Path, capsys) -> None:
    assert main(["solve", "--json", str(EXAMPLES / example)]) == 0
    from_json = json.loads(capsys.readouterr().out)
    assert main(["solve", "--json", str(_as_yaml(example, tmp_path))]) == 0
    from_yaml = json.loads(capsys.readouterr().out)
    key = "allocation" if "allocation" in from_json else "stages"
    assert from_yaml[key] == from_json[key]
    assert from_yaml["predicted"] == from_json["predicted"]


def test_a_bad_yaml_file_names_file_and_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: training\nglobal_batch: [1, 2\n")
    assert main(["solve", str(path)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "not valid YAML" in err and "line" in err


def test_a_bad_field_in_yaml_names_its_json_path(tmp_path: Path, capsys) -> None:
    path = _as_yaml("srifty-case1-resnet50.json", tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["instances"][0]["quota"] = -3
    path.write_text(yaml.safe_dump(doc))
    assert main(["solve", str(path)]) == 2
    assert "instances[0].quota" in capsys.readouterr().err


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_follow_the_umask(umask: int, mode: int, tmp_path: Path, capsys) -> None:
    previous = os.umask(umask)
    try:
        out = tmp_path / "plan.json"
        assert main(["solve", "--out", str(out), str(EXAMPLES / "srifty-case1-resnet50.json")]) == 0
        write_json(tmp_path / "other.json", {"a": 1})
    finally:
        os.umask(previous)
    assert out.stat().st_mode & 0o777 == mode
    assert (tmp_path / "other.json").stat().st_mode & 0o777 == mode


def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "kept.json"
    path.write_text("{}")
    path.chmod(0o640)
    write_json(path, {"b": 2})
    assert path.stat().st_mode & 0o777 == 0o640
    assert json.loads(path.read_text()) == {"b": 2}
