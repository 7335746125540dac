"""Markers in one place: ``-m "not process"`` runs the tests that start no
processes, ``-m "not moto"`` those that use no moto server. Both are derived
from what each test's code (its function and its fixtures) uses
(tests/markers.py): no list of modules to keep up to date.
The shared helpers of the tests (``aws_fakes``, ``helpers``) import as
top-level modules through ``pythonpath`` in pyproject.toml.

The suite runs in parallel (``-n auto``, pytest-xdist, with ``--dist
loadgroup`` from pyproject.toml): each test goes to whichever worker process
is free, except that the tests of a module with a module- or class-scoped
fixture (a Ray cluster, a moto server, a fork server, a fitted model) form
one ``xdist_group`` named after the module, so they run on one worker and
share that setup once instead of building it on every worker. ``auto``
means one worker more than half the CPUs again (3 on 2 CPUs; see
`pytest_xdist_auto_num_workers`). Tests must
not rely on each other's order or leftovers, take no fixed port (ask the OS
for one: ``aws_fakes.free_port``) and no fixed path outside ``tmp_path``."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from markers import starts_processes, uses_moto

SHARED_SCOPES = {"module", "class", "package"}


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The number of workers ``-n auto`` starts: 1.5 per CPU (3 on 2 CPUs),
    not xdist's one per CPU. Much of the suite waits rather than computes: on
    worker processes and fork servers starting, Ray daemons joining, a moto
    server, a run's clock; with one worker per CPU the CPUs sat idle for about
    a third of the run. The tests themselves allow for a loaded host (they
    must pass beside a CPU hog), so one more worker costs them nothing but
    load."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, (3 * cpus) // 2)


def shares_a_setup(item: pytest.Item) -> bool:
    """Whether `item` uses a fixture wider than one test but narrower than
    the session: one that its module's other tests would otherwise rebuild
    on another worker (session fixtures are built once per worker anyway)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(definition.scope in SHARED_SCOPES
               for definitions in info.name2fixturedefs.values() for definition in definitions)


def code_of(item: pytest.Item) -> list:
    """The functions `item` runs: the test's own and those of every fixture it uses."""
    info = getattr(item, "_fixtureinfo", None)
    fixtures = [] if info is None else [definition.func for definitions in info.name2fixturedefs.values()
                                        for definition in definitions]
    own = getattr(item, "obj", None)
    return ([own] if own is not None else []) + fixtures


# -- one worker collects first ----------------------------------------------------------------------
# Collecting imports every test module, and with them torch, Ray, moto and the rest; in a fresh
# environment (CI's) nothing of that is compiled to bytecode yet, and pytest has not yet rewritten the
# test modules' asserts. Workers that collect at once each compile and rewrite the same files (measured
# here: three cold workers 58 CPU-s, three warm 33). So the first worker (gw0) collects alone, and the
# others start once it has: they find the bytecode it wrote, and take its reading of the markers
# (tests/markers.py, a few CPU-seconds a worker) from the file it leaves. Where no bytecode is written
# (PYTHONDONTWRITEBYTECODE) they would gain nothing by waiting, and do not.
FIRST_COLLECTION = "THRIFTY_PYTEST_FIRST_COLLECTION"  # the file gw0 writes; set by the controller for its workers
FIRST_COLLECTION_WAIT_S = 120.0  # then a worker collects anyway (gw0 stuck or gone: it only costs CPU)
_FIRST_FOLDER = pytest.StashKey[str]()  # the controller's folder for that file


def build_native_hook() -> None:
    """Build the C++ reweighting hook (`thrifty.runtime.ddp.native`) before
    any test, in a process of its own (the controller imports no torch): on a
    fresh machine the build takes 20 to 40 s, which no rank of a test world
    should spend under its stall timeout. A failed build leaves the Python
    hook to the worlds, and the C++ hook's own tests skip."""
    if importlib.util.find_spec("torch") is not None:
        subprocess.run([sys.executable, "-m", "thrifty.runtime.ddp.native"], capture_output=True, timeout=900,
                       check=False)


def pytest_configure(config: pytest.Config) -> None:
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:  # the controller (or a run without workers): a fresh file name for its workers
        build_native_hook()
        if getattr(config.option, "numprocesses", None):
            folder = tempfile.mkdtemp(prefix="thrifty-pytest-")
            config.stash[_FIRST_FOLDER] = folder
            os.environ[FIRST_COLLECTION] = os.path.join(folder, "collected.json")
        return
    path, first = _first_collection(config)
    if path and not first and not sys.dont_write_bytecode:
        deadline = time.monotonic() + FIRST_COLLECTION_WAIT_S
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.2)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_FIRST_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(FIRST_COLLECTION, None)


def _first_collection(config: pytest.Config) -> tuple[str | None, bool]:
    """(the file the first worker leaves its markers in, or None: no workers; whether this is the first)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None, False
    return os.environ.get(FIRST_COLLECTION), workerinput.get("workerid") == "gw0"


def _first_markers(path: str) -> dict[str, list[bool]]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # gw0 has not written it (yet): read the markers here
        return {}


# first: xdist's worker reads the xdist_group marks in its own hook of the same name (no order given)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path, first = _first_collection(config)
    known = _first_markers(path) if path and not first else {}
    read: dict[str, list[bool]] = {}
    for item in items:
        suite = item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""
        marks = known.get(item.nodeid) or [starts_processes(code_of(item)), uses_moto(code_of(item))]
        read[item.nodeid] = marks
        if item.get_closest_marker("process") is None and marks[0]:
            item.add_marker(pytest.mark.process)
        if item.get_closest_marker("moto") is None and marks[1]:
            item.add_marker(pytest.mark.moto)
        if shares_a_setup(item) and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(suite))
    items[:] = longest_first(items)
    if path and first:
        _MARKS.update(read)


_MARKS: dict[str, list[bool]] = {}  # the first worker's markers, for the others


def pytest_collection_finish(session: pytest.Session) -> None:
    """The first worker's collection is done (with or without errors): the others may start theirs."""
    path, first = _first_collection(session.config)
    if path and first:  # atomically: a waiting worker reads it once it exists
        part = path + ".part"
        Path(part).write_text(json.dumps(_MARKS), encoding="utf-8")
        os.replace(part, path)


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """`items` with the longest work first, so that parallel workers do not
    end on one long chain while the others idle: a group (which one worker
    runs from start to end) weighs as many as its tests that start
    processes, those being the slow ones; then the other tests that start
    processes; then the rest. Stable, and the same on every worker."""
    def group_of(item: pytest.Item) -> str | None:
        mark = item.get_closest_marker("xdist_group")
        return None if mark is None else str(mark.args[0] if mark.args else mark.kwargs.get("name"))

    weight: dict[str, int] = {}
    for item in items:
        group = group_of(item)
        if group is not None:
            weight[group] = weight.get(group, 0) + (item.get_closest_marker("process") is not None)

    def key(item: pytest.Item) -> tuple[int, int, str]:
        group = group_of(item)
        if group is not None:
            return (0, -weight[group], group)
        return (1 if item.get_closest_marker("process") is not None else 2, 0, "")
    return sorted(items, key=key)


@pytest.fixture
def providers(monkeypatch):
    """Every provider a command makes, kept to look at after it closed them."""
    import thrifty.runtime.cluster.spec as spec

    made: list = []
    real = spec.cluster_provider

    def keep(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(spec, "cluster_provider", keep)
    return made
