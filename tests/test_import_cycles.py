"""No import cycle in the package, not even one hidden behind an import inside
a function (issue 34). A function-level import that closes a cycle works only
because of when it runs; it hides a dependency that goes both ways, which a
shared piece moved to where both modules can import it downward removes.

The graph (tests/import_graph.py) has an edge for every import statement at
any depth, ``if TYPE_CHECKING:`` blocks included."""

from __future__ import annotations

from pathlib import Path

from import_graph import ROOT, import_graph, package_modules


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of `graph` as [m0, m1, ..., m0], or None: a depth-first
    search, in sorted order so that the cycle named is the same every run."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, int]], modules: dict[str, Path]) -> str:
    """The cycle as one line per edge: where each module imports the next."""
    return "\n".join(f"{a} ({modules[a].relative_to(ROOT)}:{graph[a][b]}) imports {b}"
                     for a, b in zip(cycle, cycle[1:]))


def test_the_package_has_no_import_cycle():
    modules = package_modules()
    assert len(modules) > 100 and "thrifty.runtime.tuning.executors.plan" in modules
    graph = import_graph(modules)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle:\n" + describe(cycle, graph, modules)


def _graph_of(tmp_path: Path, files: dict[str, str]) -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    for relative, text in files.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    modules = package_modules(tmp_path)
    return import_graph(modules), modules


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    graph, _ = _graph_of(tmp_path, {
        "core/__init__.py": "",
        "core/a.py": "from thrifty.core.b import g\n",
        "core/b.py": "def g():\n    from thrifty.core import a\n    return a\n",
    })
    assert find_cycle(graph) == ["thrifty.core.a", "thrifty.core.b", "thrifty.core.a"]


def test_type_checking_imports_are_edges_and_parent_packages_are_not(tmp_path):
    graph, _ = _graph_of(tmp_path, {
        "core/__init__.py": "from thrifty.core.a import f\n",
        "core/a.py": "def f():\n    return 1\n",
        "core/b.py": "from thrifty.core.a import f\nfrom thrifty.core import a\n",
    })
    assert graph["thrifty.core.b"] == {"thrifty.core.a": 1}
    assert find_cycle(graph) is None
    graph, _ = _graph_of(tmp_path, {"core/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                 "    from thrifty.core.b import g\n"})
    assert find_cycle(graph) == ["thrifty.core.a", "thrifty.core.b", "thrifty.core.a"]
    # `from package import name` that is no module is an edge to the package's __init__
    graph, _ = _graph_of(tmp_path, {"core/a.py": "import typing\ndef f():\n    from thrifty.core import g\n"})
    assert find_cycle(graph) == ["thrifty.core", "thrifty.core.a", "thrifty.core"]
