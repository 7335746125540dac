"""One way to import a module that may be missing (issue 34):
`thrifty.core.optional` (`require`, `try_import`, `import_named`) is the only
library code that catches ImportError, and `lazy_exports` the only way a
package exports names lazily."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from thrifty.core.errors import MissingDependencyError, ProblemError
from thrifty.core.optional import import_named, lazy_exports, require, try_import

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("core", "datasets", "perfmodels", "solver", "runtime")
OPTIONAL = ROOT / "core" / "optional.py"
IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


def _library_files() -> list[Path]:
    return sorted(p for folder in LIBRARY for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _names(node: ast.expr | None) -> set[str]:
    """The exception class names an ``except`` clause catches (``ImportError``,
    ``builtins.ImportError``, a tuple of them)."""
    if node is None:
        return set()
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def import_error_catches(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line`` of every ``except`` clause in `path` that names ImportError or ModuleNotFoundError."""
    tree = ast.parse(path.read_text(), str(path))
    return [f"{path.relative_to(root)}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.ExceptHandler) and _names(node.type) & IMPORT_ERRORS]


def test_no_library_code_catches_import_error_outside_core_optional():
    files = _library_files()
    assert OPTIONAL in files and len(files) > 100
    bad = [where for path in files if path != OPTIONAL for where in import_error_catches(path)]
    assert not bad, ("these catch ImportError themselves; use thrifty.core.optional (require, try_import, "
                     "import_named):\n" + "\n".join(bad))


def test_the_check_sees_a_catch_in_any_form(tmp_path):
    module = tmp_path / "pkg" / "m.py"
    module.parent.mkdir()
    module.write_text("def f():\n    try:\n        import x\n    except (KeyError, builtins.ModuleNotFoundError):\n"
                      "        pass\n    try:\n        import y\n    except ImportError as e:\n        raise\n"
                      "    try:\n        import z\n    except Exception:\n        pass\n")
    assert import_error_catches(module, tmp_path) == ["pkg/m.py:4", "pkg/m.py:8"]


def test_packages_export_lazily_only_through_lazy_exports():
    """A package ``__init__`` that defines its own module-level ``__getattr__`` is a second way."""
    bad = []
    for path in _library_files():
        if path.name != "__init__.py":
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__"):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} defines {node.name}")
    assert not bad, "use thrifty.core.optional.lazy_exports:\n" + "\n".join(bad)


def test_try_import_gives_the_module_or_none():
    assert try_import("json") is sys.modules["json"]
    assert try_import("thrifty_no_such_module") is None
    assert try_import("json.thrifty_no_such_submodule") is None


def test_require_names_the_extra_or_a_broken_install():
    with pytest.raises(MissingDependencyError, match=r"pip install 'thrifty\[torch\]'") as optional:
        require("thrifty_no_such_module", "torch", package="torch")
    assert optional.value.package == "torch" and optional.value.extra == "torch"
    with pytest.raises(MissingDependencyError, match="reinstall thrifty") as core:
        require("thrifty_no_such_module", None, package="ortools")
    assert "'ortools'" in str(core.value) and "pip install 'thrifty[" not in str(core.value)


def test_import_named_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "thrifty_user_needs.py").write_text("import thrifty_not_installed\n")
    (tmp_path / "thrifty_user_raises.py").write_text("raise RuntimeError('boom')\n")
    assert import_named("json", "x") is sys.modules["json"]
    with pytest.raises(ProblemError, match=r"^trainer 't': there is no module named 'thrifty_nope' "):
        import_named("thrifty_nope.sub", "trainer 't'")
    with pytest.raises(ProblemError, match="it needs the module 'thrifty_not_installed', which is not installed"):
        import_named("thrifty_user_needs", "w")
    with pytest.raises(ProblemError, match="importing 'thrifty_user_raises' raised RuntimeError: boom"):
        import_named("thrifty_user_raises", "w")


def test_lazy_exports_reads_relative_and_absolute_modules():
    getattr_, dir_ = lazy_exports("thrifty.core", {"ProblemError": "errors", "dumps": "thrifty.core.io"})
    assert getattr_("ProblemError") is ProblemError
    with pytest.raises(AttributeError, match="has no attribute 'dumps'"):  # thrifty.core.io has no `dumps`
        getattr_("dumps")
    with pytest.raises(AttributeError, match="module 'thrifty.core' has no attribute 'nope'"):
        getattr_("nope")
    assert dir_() == ["ProblemError", "dumps"]
    import thrifty.runtime.training as training
    from thrifty.runtime.ddp.trainer import Trainer

    assert training.Trainer is Trainer  # an absolute module, as the training package exports it
