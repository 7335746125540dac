"""Type-check the ``thrifty`` package with mypy (configured in pyproject.toml [tool.mypy]).

The repository maps folders to packages (pyproject.toml [tool.setuptools]
package-dir: ``solver/`` is ``thrifty.solver`` and so on), which mypy cannot
follow, and the editable install exposes the packages through an import hook
that mypy does not run. So this lays the package out as setuptools maps it,
as symlinks in a temporary folder, runs ``mypy -p thrifty`` there with the
repository's configuration, and prints each finding with its path in the
repository. Extra arguments go to mypy. Exit status: mypy's.

    python3 .ci/mypy.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "thrifty"


def top_level_folders(pyproject: Path) -> dict[str, str]:
    """``{subpackage: folder}`` for each ``thrifty.<name>`` of package-dir (nested
    packages must be the same folders' subfolders, as mypy will find them there)."""
    mapping = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]
    top: dict[str, str] = {}
    for package, folder in mapping.items():
        parts = package.split(".")
        if parts[0] != PACKAGE or len(parts) < 2:
            sys.exit(f"{pyproject}: package-dir maps {package!r}; this script knows only {PACKAGE}.<name> packages")
        if len(parts) == 2:
            top[parts[1]] = folder
    for package, folder in mapping.items():
        parts = package.split(".")
        if len(parts) > 2 and Path(folder) != Path(top[parts[1]], *parts[2:]):
            sys.exit(f"{pyproject}: package-dir maps {package!r} to {folder!r}, not a subfolder of its parent's")
    return top


def main(argv: list[str]) -> int:
    pyproject = ROOT / "pyproject.toml"
    top = top_level_folders(pyproject)
    with tempfile.TemporaryDirectory(prefix="thrifty-mypy-") as view:
        package = Path(view, PACKAGE)
        package.mkdir()
        (package / "__init__.py").touch()
        for name, folder in top.items():
            (package / name).symlink_to(ROOT / folder, target_is_directory=True)
        command = [sys.executable, "-m", "mypy", "--config-file", str(pyproject),
                   "--cache-dir", os.devnull, "-p", PACKAGE, *argv]
        result = subprocess.run(command, cwd=view, capture_output=True, text=True)
    # findings start with the path mypy saw (thrifty/solver/x.py): print the repository's (solver/x.py)
    prefixes = {f"{PACKAGE}/{name}/": f"{Path(folder).as_posix()}/" for name, folder in top.items()}
    for line in result.stdout.splitlines():
        for seen, real in prefixes.items():
            if line.startswith(seen):
                line = real + line[len(seen):]
                break
        print(line)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
