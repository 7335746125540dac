"""Models and catalogs read once per file while the file is unchanged
(`thrifty.core.io.memo_by_file`): a process solving many problems fits each
profile once, and a file written again is read again."""

from __future__ import annotations

import os

import pytest

from thrifty.core.errors import ProblemError
from thrifty.core.io import memo_by_file, write_json
from thrifty.datasets.catalog import load_catalog


def test_a_file_is_built_once_while_unchanged_and_again_once_rewritten(tmp_path):
    path = tmp_path / "model.json"
    write_json(path, {"a": 1})
    built: list[int] = []

    def build() -> dict:
        built.append(1)
        return {"n": len(built)}

    first = memo_by_file("test", path, build)
    assert memo_by_file("test", path, build) is first and len(built) == 1
    assert memo_by_file("test", path, build, "other key") == {"n": 2}  # the further key is part of the identity
    write_json(path, {"a": 2, "b": 3})  # a new file (atomic replace): a new inode, size and time
    assert memo_by_file("test", path, build) == {"n": 3}


def test_a_file_that_cannot_be_read_is_not_kept_and_its_error_names_it(tmp_path):
    missing = tmp_path / "gone.json"
    calls: list[int] = []

    def build() -> None:
        calls.append(1)
        raise ProblemError("file not found", source=str(missing))

    for _ in range(2):
        with pytest.raises(ProblemError):
            memo_by_file("test", missing, build)
    assert len(calls) == 2


def test_a_catalog_changed_on_disk_is_read_again(tmp_path):
    from thrifty.datasets.catalog import DEFAULT_CATALOG

    path = tmp_path / "catalog.json"
    path.write_text(DEFAULT_CATALOG.read_text())
    before = load_catalog(path)
    assert load_catalog(path) is before
    text = path.read_text()
    name = next(iter(before.types))
    path.write_text(text)  # the same content written in place: a new modification time
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns + 10**9))
    again = load_catalog(path)
    assert again is not before and again.types[name] == before.types[name]
