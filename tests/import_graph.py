"""The import graph of the package, read from its source with ast: what the
import-cycle test checks (tests/test_import_cycles.py) and what the process
marker is derived from (tests/markers.py).

One node per module of the package (every ``.py`` file under the layers'
folders) and an edge for every import statement at any depth: module level,
inside functions and classes, under ``try`` and under ``if TYPE_CHECKING:``
(a type two modules need of each other is a dependency both ways too).
``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to
``a.b`` (for a package, its ``__init__``) and, when the package re-exports
``c`` (imported in its ``__init__``, or lazily through
`thrifty.core.optional.lazy_exports`), to the module that defines it as well.
Importing a module also runs its parent packages' ``__init__``; those
implicit edges are not counted (a package's ``__init__`` re-exporting its
modules, which import their siblings, is not a cycle of the design)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("core", "datasets", "perfmodels", "solver", "runtime")


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package
    (``datasets/scripts`` included: scripts must not close cycles either)."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(["thrifty", *parts])] = path
    return out


def import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of `tree`, at any depth, in the order of the source."""
    return sorted((node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))),
                  key=lambda node: (node.lineno, node.col_offset))


def exported(package: str, tree: ast.Module, modules: dict[str, Path]) -> dict[str, str]:
    """Name -> defining module of what a package's ``__init__`` re-exports:
    names it imports at its top level from the package's modules, and those
    it exports through ``lazy_exports("package", {...})`` (the dict written in
    the call or bound to a module-level name)."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            out.update({alias.asname or alias.name: node.module for alias in node.names})
    dicts = {target.id: node.value for node in tree.body if isinstance(node, ast.Assign)
             for target in node.targets if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict)}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "lazy_exports"
                and len(node.args) == 2):
            continue
        exports = node.args[1]
        if isinstance(exports, ast.Name):
            exports = dicts.get(exports.id, exports)
        if isinstance(exports, ast.Dict):
            for key, value in zip(exports.keys, exports.values):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                    module = str(value.value)
                    out[str(key.value)] = module if module.startswith("thrifty.") else f"{package}.{module}"
    return out


def module_imports(name: str, path: Path, modules: dict[str, Path], exports: dict[str, dict[str, str]],
                   through_packages: bool = False, tree: ast.Module | None = None) -> list[tuple[str, int]]:
    """(imported name, line) of every import in module `name`: a module of
    the package when it names one, else the dotted name as written
    (``subprocess``, ``torch.distributed.init_process_group``). A name a
    package re-exports (`exports`) is imported from its defining module too,
    and with `through_packages` from that module only, not the package.
    `tree`: the module's source, parsed already."""
    out: list[tuple[str, int]] = []
    for node in import_nodes(tree or ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
            continue
        base = node.module or ""
        if node.level:  # relative: from the module's package, one level up per extra dot
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if full in modules:
                out.append((full, node.lineno))
                continue
            defining = exports.get(base, {}).get(alias.name)
            if defining in modules:
                out.append((defining, node.lineno))
                if through_packages:
                    continue
            out.append((base if base in modules else full, node.lineno))
    return out


def exports_of(modules: dict[str, Path]) -> dict[str, dict[str, str]]:
    """Package -> the names it re-exports and their defining modules."""
    return {name: exported(name, ast.parse(path.read_text(), str(path)), modules)
            for name, path in modules.items() if path.name == "__init__.py"}


def import_graph(modules: dict[str, Path], through_packages: bool = False) -> dict[str, dict[str, int]]:
    """Module -> {imported module of the package: line of the first such
    import}; `through_packages` as `module_imports`."""
    exports = exports_of(modules)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in module_imports(name, path, modules, exports, through_packages):
            if target in modules and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph
