"""Small I/O helpers shared by every layer: atomic writes, loading JSON or
YAML documents with errors that name the file (and the line), and
append-only JSON-lines logs (`JsonLinesLog`)."""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import sys
from pathlib import Path
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from thrifty.core.errors import ProblemError

T = TypeVar("T")

__all__ = ["atomic_write_text", "atomic_write_bytes", "read_json", "read_yaml", "read_document",
           "write_json", "JsonLinesLog", "YAML_SUFFIXES", "memo_by_file"]

YAML_SUFFIXES = (".yaml", ".yml")
# the deepest nesting of YAML flow collections (``[`` and ``{``) a document may have: PyYAML's scanner
# keeps one possible key per open flow level and rescans them at every token, so its time grows with
# the depth times the length (seconds for a few kilobytes nested a few thousand deep), and a problem
# file nests a few levels
YAML_MAX_FLOW_DEPTH = 100


def _create_temporary(folder: Path, name: str, mode: int | None) -> tuple[int, Path]:
    """An exclusive new file next to the target. Created with 0o666 so that the
    kernel applies the umask (``tempfile.mkstemp`` makes 0o600 files, which
    would leave every output unreadable to the group); `mode` (the mode of the
    file being replaced) wins when given."""
    while True:
        tmp = folder / f".{name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except FileExistsError:
            continue
        if mode is not None:
            try:
                os.fchmod(fd, mode)
            except BaseException:
                os.close(fd)
                os.unlink(tmp)
                raise
        return fd, tmp


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one,
    never half of it: a temporary file in the same folder, fsync, rename. A new
    file gets ``0o666 & ~umask``, like any file the user creates; a replaced
    file keeps its mode. A path that cannot hold a file (a folder there, a
    file where its folder should be, no permission) is a `ProblemError`
    naming it."""
    path = Path(path)
    try:
        _write_replacing(path, data)
    except _UNWRITABLE as e:  # the place named cannot hold the file: bad input, not a crash
        raise ProblemError(f"cannot be written: {e.strerror or e}", source=str(path)) from None


# where a file cannot go: a folder in its place, a file in its folder's place, no permission
_UNWRITABLE = (IsADirectoryError, NotADirectoryError, PermissionError, FileExistsError)


def _write_replacing(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode: int | None = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = None
    fd, tmp = _create_temporary(path.parent, path.name, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ProblemError("file not found", source=str(path)) from e
    except UnicodeDecodeError as e:
        raise ProblemError(f"is not UTF-8 text (byte {e.start})", source=str(path)) from None
    except OSError as e:
        raise ProblemError(f"cannot read file: {e.strerror}", source=str(path)) from e
    except ValueError:  # a path with a NUL byte names no file on any system
        raise ProblemError("is not a file name: it contains a NUL byte", source=repr(str(path))) from None


def _parse(path: Path, kind: str, loads: Any, syntax: type[Exception], where: Any) -> Any:
    """`loads` the file's text; every failure is a `ProblemError` naming the
    file: a syntax error (`syntax`, described by `where`), nesting too deep, or
    an integer beyond Python's digit limit."""
    text = _read_text(path)
    try:
        return loads(text)
    except syntax as e:
        raise ProblemError(f"not valid {kind}: {where(e)}", source=str(path)) from None
    except RecursionError:
        raise ProblemError(f"not usable {kind}: nested too deeply", source=str(path)) from None
    except _DuplicateKey as e:
        raise ProblemError(f"not usable {kind}: {e}", source=str(path)) from None
    except ValueError as e:
        if "int_max_str_digits" in str(e) or "Exceeds the limit" in str(e):
            raise ProblemError(f"not usable {kind}: a number has more than {sys.get_int_max_str_digits():,} digits",
                               source=str(path)) from None
        raise ProblemError(f"not usable {kind}: {e}", source=str(path)) from None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once: with a key twice, JSON readers keep one of the values
    silently (Python's the last), so a file's author cannot know which one counts."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise _DuplicateKey(f"the key {json.dumps(twice)} is given twice in one object; give it once")
    return obj


def _loads_json(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_unique_keys)


def read_json(path: str | os.PathLike[str]) -> Any:
    """Load a JSON file; a missing or malformed file, or an object with a key given twice, is a
    `ProblemError` naming it."""
    return _parse(Path(path), "JSON", _loads_json, json.JSONDecodeError,
                  lambda e: f"{e.msg} at line {e.lineno} column {e.colno}")


def _yaml_where(e: Exception) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
    return " ".join(str(getattr(e, "problem", None) or e).split()) + where


@functools.cache
def _unique_key_loader() -> Any:
    """PyYAML's safe loader, refusing a mapping with a key given twice (as `_unique_keys` for JSON; a merge
    key ``<<`` may still override what it merges)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    twice = key in seen
                except TypeError:  # an unhashable key: the safe loader says so itself
                    break
                if twice:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice in one mapping; give it once",
                        key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def flow_depth(text: str) -> int:
    """The deepest nesting of YAML flow collections in `text`: brackets and
    braces outside quoted scalars and comments. An estimate, as it reads no
    YAML grammar: a bracket inside a plain scalar counts, and an apostrophe
    inside one (``don't``) opens a quoted span that hides what follows it
    on the line and beyond, up to the next apostrophe."""
    depth = deepest = 0
    for match in _FLOW_TOKENS.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(depth - 1, 0)
    return deepest


# an opening or closing bracket, or a span to skip: a double-quoted scalar (with escapes), a single-quoted
# one ('' is a quote inside it) or a comment (# after a blank or at a line's start)
_FLOW_TOKENS = re.compile(r"""[\[\]{}]|"(?:[^"\\]|\\.)*"?|'(?:[^']|'')*'?|(?:(?<=\s)|^)#[^\n]*""", re.M)


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """Load a YAML file (safe loader: plain data only, each key of a mapping once, flow collections
    nested at most `YAML_MAX_FLOW_DEPTH` deep); errors name the file and line."""
    import yaml  # only YAML files pay for the import

    loader = _unique_key_loader()

    def loads(text: str) -> Any:
        if flow_depth(text) > YAML_MAX_FLOW_DEPTH:
            raise RecursionError(f"flow collections nested more than {YAML_MAX_FLOW_DEPTH} deep")
        return yaml.load(text, Loader=loader)

    return _parse(Path(path), "YAML", loads, yaml.YAMLError, _yaml_where)


def read_document(path: str | os.PathLike[str]) -> Any:
    """Load a problem-like file: YAML for ``.yaml``/``.yml``, JSON otherwise.
    Every command that reads a problem goes through this one function."""
    path = Path(path)
    if path.suffix.lower() in YAML_SUFFIXES:
        return read_yaml(path)
    return read_json(path)


_MEMO: dict[tuple[Any, ...], Any] = {}
MEMO_ENTRIES = 64  # files kept at once; the oldest goes first


def memo_by_file(kind: str, path: str | os.PathLike[str], build: Callable[[], T], *key: Any) -> T:
    """`build()`, the `kind` of thing read from the file at `path` (with the
    further `key`), kept while the file is the same file unchanged (its real
    path, inode, size and modification time): a process that solves many
    problems (a sweep, a notebook, the tests) reads and fits each model or
    catalog once, and a file written again is read again. What `build`
    returns is shared, so it must not be changed by its users. A file that
    cannot be read is not kept: `build` runs, and its error names the file."""
    try:
        st = os.stat(path)
    except OSError:
        return build()
    ident = (kind, os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns, *key)
    if ident in _MEMO:
        return _MEMO[ident]
    value = build()
    if len(_MEMO) >= MEMO_ENTRIES:
        del _MEMO[next(iter(_MEMO))]
    _MEMO[ident] = value
    return value


class JsonLinesLog:
    """Append-only JSON lines, each flushed to the operating system as
    written, so a process killed at any moment leaves every line before the
    kill (a reader skips a last line cut short); `close` fsyncs."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, event: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(event, allow_nan=True, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
