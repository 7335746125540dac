"""Where code may reach (docs/architecture.md, issues 15 and 34): core <-
datasets <- perfmodels <- solver <- runtime with no upward import; the pure
models in perfmodels import no torch, with no exception (measurement lives in
runtime/measure); the worker-world package (runtime/worlds) sits below
everything in the runtime that launches and imports none of it; the rest of
the runtime reaches measurement only through the tools' public entry points
(the `thrifty.runtime.measure` package); and every worker process starts
through the one worker-world package, which holds every launcher: nothing
else starts a process but the Ray daemons' start, named below with its
reason."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("core", "datasets", "perfmodels", "solver", "runtime")


def _python_files(folder: str) -> list[Path]:
    """The modules of a layer. ``datasets/scripts`` are not: they are the
    scripts that make the data, and use the whole library to do it."""
    return sorted(p for p in (ROOT / folder).rglob("*.py")
                  if "__pycache__" not in p.parts and ROOT / "datasets" / "scripts" not in p.parents)


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement names (at any depth), with its line."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return out


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


@pytest.mark.parametrize("layer", LAYERS)
def test_no_layer_imports_a_layer_above_it(layer: str):
    above = LAYERS[LAYERS.index(layer) + 1:]
    bad = [f"{_where(p, line)} imports {name}" for p in _python_files(layer) for line, name in _imports(p)
           if any(name == f"thrifty.{up}" or name.startswith(f"thrifty.{up}.") for up in above)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package, apart", [
    ("ddp", ("training", "tuning")),  # the DDP kit serves both, and knows neither
    ("tuning", ("training",)),  # tuning trials run on the DDP kit, not on the training runtime
])
def test_runtime_packages_stay_apart(package: str, apart: tuple[str, ...]):
    files = _python_files(f"runtime/{package}")
    assert files
    bad = [f"{_where(p, line)} imports {name}" for p in files for line, name in _imports(p)
           if any(name == f"thrifty.runtime.{a}" or name.startswith(f"thrifty.runtime.{a}.") for a in apart)]
    assert not bad, "\n".join(bad)


def test_pure_models_import_no_torch():
    files = _python_files("perfmodels")
    assert len(files) > 10
    bad = [f"{_where(p, line)} imports {name}" for p in files for line, name in _imports(p)
           if name == "torch" or name.startswith("torch.")]
    assert not bad, "\n".join(bad)


def test_runtime_reaches_measurement_through_its_public_surface_only():
    public = {f"thrifty.runtime.measure.{name}" for name in __import__(
        "thrifty.runtime.measure", fromlist=["__all__"]).__all__}
    bad = []
    for path in _python_files("runtime"):
        for line, name in _imports(path):
            if not name.startswith("thrifty.runtime.measure"):
                continue
            if name == "thrifty.runtime.measure" or name in public or path.is_relative_to(ROOT / "runtime" / "measure"):
                continue
            bad.append(f"{_where(path, line)} imports {name}")
    assert not bad, "\n".join(bad)


def test_worlds_import_nothing_that_launches():
    """The worker-world package is the bottom of the runtime: training,
    tuning, measurement and the cluster code start workers through it, so it
    imports none of them (nor the commands)."""
    files = _python_files("runtime/worlds")
    assert files
    bad = [f"{_where(p, line)} imports {name}" for p in files for line, name in _imports(p)
           if name.startswith("thrifty.runtime.") and not name.startswith("thrifty.runtime.worlds")]
    assert not bad, "\n".join(bad)


# What starts a process. The worker-world package (runtime/worlds) may: its fork server is how every worker
# starts, on this host and on a Ray node. Outside it, one file, for one reason:
STARTS_A_PROCESS = ("os.fork", "subprocess.Popen", "multiprocessing", "spawn")
NOT_A_WORKER = {
    Path("runtime/cluster/bootstrap.py"): "starts Ray's daemons (`ray start`, a node's or the head's), "
                                          "which Ray runs and watches itself",
    Path("benchmarks/gpu_check.py"): "a harness outside the library: it runs thrifty's own commands as a user's "
                                     "shell does, each in a session of its own under a time limit",
    Path("benchmarks/online_calibration.py"): "a harness outside the library: it runs `thrifty run` as a user's "
                                              "shell does, beside a CPU hog of busy processes it starts and stops",
}


def test_one_way_to_start_worker_processes():
    """Every process thrifty starts, it starts through the worker-world
    package (a `World`, whose launcher forks it from a fork server), but the
    Ray daemons; nothing else forks, spawns or opens a subprocess, in the
    library, its data scripts or the benchmarks."""
    worlds = ROOT / "runtime" / "worlds"
    bad, seen = [], set()
    for folder in (*LAYERS, "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts or path.is_relative_to(worlds):
                continue
            text, where = path.read_text(), path.relative_to(ROOT)
            hits = [needle for needle in STARTS_A_PROCESS if needle in text]
            if hits and where in NOT_A_WORKER:
                seen.add(where)
            elif hits:
                bad.append(f"{where} uses {', '.join(hits)}")
    assert not bad, "\n".join(bad)
    assert seen == set(NOT_A_WORKER), f"the exception no longer starts anything: {set(NOT_A_WORKER) - seen}"


def test_ranks_are_launched_by_the_worker_world_package_alone():
    """The launchers (the local one and the Ray one, the driver's side and
    the node's) live in runtime/worlds: no module elsewhere hosts a world's
    rendezvous store, which is the first thing a launcher does."""
    worlds = ROOT / "runtime" / "worlds"
    bad = [f"{p.relative_to(ROOT)} hosts a TCPStore" for p in _python_files("runtime")
           if not p.is_relative_to(worlds) and "TCPStore(" in p.read_text()]
    assert not bad, "\n".join(bad)
