"""What a test does, read from its code: whether it starts processes (the
``process`` marker, tests/conftest.py) or uses moto (``moto``: the same
reading, with moto the only module sought), with no list of test modules to
keep.

A test starts processes when the code it runs, read with ast, uses something
that starts one:

- a module that starts processes by itself (`PRIMITIVES`: ``subprocess``,
  ``multiprocessing``, Ray, ``torch.distributed``...) or a spawning function
  of ``os`` (``os.fork``, ``os.system``...);
- a name thrifty defines in a module that launches: one whose imports, at any
  depth (tests/import_graph.py), reach such a module (the worker worlds, the
  training and tuning drivers, the measurement tools, the cluster code); this
  is read off the library, so a new launching module needs no edit here;
- the command line (``thrifty.runtime.cli.main``) with a command whose module
  launches (``run``, ``tune``, ``profile``...), or a command the code does not
  spell out (assumed to);
- a function or class of the tests themselves that does any of this (helper
  modules such as ``ray_cluster`` included), followed through its calls.

The code a test runs is its function and every fixture it uses (fixtures
are where module-scoped clusters and servers start). Names are looked up in
the globals the code runs with, so ``from thrifty.runtime.tuning import
WorldExecutor`` is the executor's own module, whatever package re-exports it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import os
import sys
import textwrap
import types
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from import_graph import exports_of, module_imports, package_modules

TESTS = Path(__file__).resolve().parent
PRIMITIVES = ("subprocess", "multiprocessing", "ray", "torch.distributed", "torch.multiprocessing",
              "concurrent.futures.process", "pty")
OS_SPAWNS = frozenset({"fork", "forkpty", "posix_spawn", "posix_spawnp", "spawnv", "spawnve", "spawnvp",
                       "spawnl", "spawnlp", "system", "popen", "execv", "execve", "execvp", "execvpe"})
CLI_MAIN = "thrifty.runtime.cli.main"
IMPORTORSKIP = "_pytest.outcomes.importorskip"

__all__ = ["starts_processes", "why_processes", "uses_moto", "launching_modules", "command_launches"]


@dataclass(frozen=True)
class Sought:
    """What a marker looks for in a test's code: modules that do it by
    themselves (`primitives`), and whether thrifty's launching modules, the
    CLI's launching commands and ``os``'s spawning functions count too."""

    name: str
    primitives: tuple[str, ...]
    library: bool = False

    def primitive(self, name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in self.primitives)


PROCESS = Sought("process", PRIMITIVES, library=True)
MOTO = Sought("moto", ("moto",))  # a moto server (the tests' aws_fakes.MotoServer) or moto's in-process fakes


def _is_primitive(name: str) -> bool:
    return PROCESS.primitive(name)


@lru_cache(maxsize=1)
def _exports() -> tuple[dict[str, Path], dict[str, dict[str, str]]]:
    modules = package_modules()
    return modules, exports_of(modules)


@lru_cache(maxsize=1)
def launching_modules() -> frozenset[str]:
    """The modules of thrifty whose imports, at any depth, reach a module
    that starts processes, or that call a spawning function of ``os``. A
    name a package re-exports counts as its own module's (importing
    `HyperSched` from `thrifty.runtime.tuning` is not importing the world
    executor beside it)."""
    modules, exports = _exports()
    launching, graph = set(), {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        imports = [target for target, _ in module_imports(name, path, modules, exports, True, tree)]
        graph[name] = {target for target in imports if target in modules and target != name}
        if any(_is_primitive(target) for target in imports) or any(
                isinstance(node, ast.Attribute) and node.attr in OS_SPAWNS and isinstance(node.value, ast.Name)
                and node.value.id == "os" for node in ast.walk(tree)):
            launching.add(name)
    changed = True
    while changed:  # every module that imports a launching one launches
        changed = False
        for name, edges in graph.items():
            if name not in launching and launching & edges:
                launching.add(name)
                changed = True
    return frozenset(launching)


def command_launches(command: str) -> bool:
    """Whether ``thrifty COMMAND`` may start processes (its module launches);
    an unknown command does not run at all."""
    from thrifty.runtime.cli import COMMANDS

    module = COMMANDS.get(command)
    return module is not None and f"thrifty.runtime.commands.{module}" in launching_modules()


def _module_launches(module: str, sought: Sought = PROCESS) -> bool:
    if sought.primitive(module):
        return True
    return sought.library and module.startswith("thrifty.") and module in launching_modules()


def _imported_module(module: str, name: str | None) -> str:
    """The module that ``from module import name`` (or ``import module``)
    takes its name from: a submodule, the module a package re-exports the
    name from, or `module` itself."""
    if name is None:
        return module
    modules, exports = _exports()
    if f"{module}.{name}" in modules or _is_primitive(f"{module}.{name}"):
        return f"{module}.{name}"
    return exports.get(module, {}).get(name, module)


def _defined_in_tests(obj: Any) -> bool:
    try:
        source = inspect.getsourcefile(obj)
    except TypeError:
        return False
    return source is not None and Path(source).resolve().parent == TESTS


def _object_launches(obj: Any, walk: _Walk, sought: Sought) -> str | None:
    """What in using `obj` (a module, a function or class, a method) may start processes, or None."""
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}" if _module_launches(obj.__name__, sought) else None
    obj = getattr(obj, "__func__", obj)  # a bound or class method: its function
    try:
        obj = inspect.unwrap(obj)  # a decorated function (a context manager...): its own code
    except ValueError:  # a chain of __wrapped__ that loops
        return None
    module = getattr(obj, "__module__", None)
    if not callable(obj) or not isinstance(module, str) or module == __name__:  # this module reads code, runs none
        return None
    if _defined_in_tests(obj):
        why = _code_launches(obj, walk, sought)
        return f"{obj.__qualname__}: {why}" if why else None
    name = f"{module}.{getattr(obj, '__qualname__', '')}"
    if name == CLI_MAIN:
        return None  # decided where it is called, by the command
    return name if _module_launches(module, sought) else None


def _cli_call_launches(call: ast.Call) -> str | None:
    """A call of the command line: launches when its first word is a
    launching command, or when the code does not spell the word out."""
    argv = call.args[0] if call.args else None
    if isinstance(argv, (ast.List, ast.Tuple)):
        first = argv.elts[0] if argv.elts else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return f"thrifty {first.value}" if command_launches(first.value) else None
        return "thrifty with a command not spelt out" if isinstance(first, ast.Starred) else None
    return None if argv is None else "thrifty with a command not spelt out"


def _resolve(node: ast.expr, scope: dict[str, Any]) -> Any:
    """The object a ``Name`` or ``a.b.c`` chain names in `scope`, or None."""
    if isinstance(node, ast.Name):
        return scope.get(node.id, getattr(builtins, node.id, None))
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, scope)
        if base is None:
            return None
        if isinstance(base, types.ModuleType) and base.__name__ == "os" and node.attr in OS_SPAWNS:
            return os.fork  # stands for every spawning function of os
        return getattr(base, node.attr, None)
    return None


def _loaded(module: str) -> types.ModuleType | None:
    """`module` if it is imported already, or is one of the tests' own
    helpers (imported now: they are light); None otherwise (reading a test
    imports nothing heavy)."""
    if module in sys.modules:
        return sys.modules[module]
    if (TESTS / f"{module}.py").is_file():
        return importlib.import_module(module)
    return None


class _Walk:
    """One reading of a test's code: the depth of each object being read
    (the chain of calls followed so far), and the lowest depth that a call
    back into that chain reached while reading the current object (a
    recursion: what the object it enters does is counted where it was
    entered, so an answer read below it may be partial)."""

    def __init__(self) -> None:
        self.depth: dict[int, int] = {}
        self.low = sys.maxsize


# (sought, id of a test's function or class) -> (it, what it does), once known for good: a "yes" always; a "no"
# when its reading called back into no object read above it (the object is kept, so its id is not reused)
_FOUND: dict[tuple[str, int], tuple[Any, str | None]] = {}


def _code_launches(obj: Any, walk: _Walk, sought: Sought) -> str | None:
    """What in the code of `obj` (a function or a class of the tests) does what `sought` seeks, or None."""
    key = (sought.name, id(obj))
    hit = _FOUND.get(key)
    if hit is not None and hit[0] is obj:
        return hit[1]
    entered = walk.depth.get(id(obj))
    if entered is not None:  # being read (recursion): what it does is counted where it was entered
        walk.low = min(walk.low, entered)
        return None
    depth = walk.depth[id(obj)] = len(walk.depth)
    outer_low, walk.low = walk.low, sys.maxsize
    try:
        found = _reads_launching(obj, walk, sought)
    finally:
        del walk.depth[id(obj)]
    if found or walk.low >= depth:  # no call back above this object: the answer is whole
        _FOUND[key] = (obj, found)
    walk.low = min(outer_low, walk.low)
    return found


_READ: dict[int, tuple[Any, tuple[list[ast.AST], dict[str, Any]] | None]] = {}  # id(obj) -> (obj, what _read gave)


def _read(obj: Any) -> tuple[list[ast.AST], dict[str, Any]] | None:
    """The nodes of `obj`'s code, without annotations and decorators, and the
    names its code runs with (None without source); read once per object
    (both markers read the same code, and a helper is read for every test
    that calls it). The object is kept with its entry, so its id is not reused."""
    hit = _READ.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    try:
        source = textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        _READ[id(obj)] = (obj, None)
        return None
    scope = dict(vars(inspect.getmodule(obj) or builtins))
    tree = ast.parse(source)
    for node in ast.walk(tree):  # what the code imports where it runs: the tests' own helpers, followed like globals
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            module = _loaded(node.module)
            for alias in node.names if module is not None else ():
                scope[alias.asname or alias.name] = getattr(module, alias.name, None)
    for node in ast.walk(tree):  # annotations name types, decorators run at import: they start nothing
        if isinstance(node, ast.arg | ast.AnnAssign):
            node.annotation = ast.Constant(None)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            node.decorator_list = []
            if not isinstance(node, ast.ClassDef):
                node.returns = None
    read = (list(ast.walk(tree)), scope)
    _READ[id(obj)] = (obj, read)
    return read


def _reads_launching(obj: Any, walk: _Walk, sought: Sought) -> str | None:
    read = _read(obj)
    if read is None:
        return None
    nodes, scope = read
    for node in nodes:
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names if _module_launches(alias.name, sought)]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found = [f"{node.module}.{alias.name}" for alias in node.names
                     if _module_launches(_imported_module(node.module, alias.name), sought)]
        elif isinstance(node, ast.Call):
            target = _resolve(node.func, scope)
            called = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', '')}"
            first = node.args[0] if node.args else None
            if called == IMPORTORSKIP and isinstance(first, ast.Constant) and isinstance(first.value, str):
                found = [first.value] if _module_launches(first.value, sought) else []  # an import, by name
            else:
                found = [why for why in [_cli_call_launches(node) if called == CLI_MAIN and sought.library else None]
                         if why]
        elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            target = _resolve(node, scope)
            if target is os.fork:
                why = "os.fork" if sought.library else None
            else:
                why = None if target is None else _object_launches(target, walk, sought)
            found = [why] if why else []
        else:
            continue
        if found:
            return found[0]
    return None


def why_processes(code: list[Any], sought: Sought = PROCESS) -> str | None:
    """What in these functions (a test and its fixtures) may start
    processes (``helper: thrifty run``), or with `sought` do what it seeks; None if nothing."""
    for obj in code:
        obj = inspect.unwrap(obj)
        why = _code_launches(obj, _Walk(), sought)
        if why:
            return f"{getattr(obj, '__qualname__', obj)}: {why}"
    return None


def starts_processes(code: list[Any]) -> bool:
    """Whether running these functions (a test and its fixtures) may start processes."""
    return why_processes(code) is not None


def uses_moto(code: list[Any]) -> bool:
    """Whether these functions (a test and its fixtures) use moto: its server or its fakes."""
    return why_processes(code, MOTO) is not None
