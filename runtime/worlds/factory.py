"""Functions named ``package.module:function``, or ``path/to/file.py:function``
(a file imported by its path, `thrifty.core.optional.import_file`): how a
worker process finds the code it runs (a trainer, a workload, a rank's entry
point). Shared by the runtime and the measurement tools; importing this
module imports no torch."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from thrifty.core.errors import ProblemError, closest_names
from thrifty.core.optional import file_spec, import_file, import_named

__all__ = ["resolve_factory"]

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"


_SPEC = re.compile(rf"^({_DOTTED}):({_DOTTED})$")



def resolve_factory(spec: str, returns: str = "a value") -> Callable[..., Any]:
    """Resolve ``package.module:function`` (the function may be a dotted
    attribute path, ``module:Class.method``), or ``path/to/file.py:function``
    (a relative path from the current folder), to that callable. A bad spec,
    a module or file that cannot be imported, a missing or non-callable
    attribute is a `ProblemError` naming the spec (`returns` says, in that
    error, what the callable should return)."""
    in_file = file_spec(spec) if isinstance(spec, str) else None
    match = _SPEC.match(spec.strip()) if isinstance(spec, str) and in_file is None else None
    if in_file is not None and re.fullmatch(_DOTTED, in_file[1]):
        module_name, attribute_path = in_file
        module = import_file(module_name, f"factory '{spec}'")
    elif match is not None:
        module_name, attribute_path = match.groups()
        module = import_named(module_name, f"factory '{spec}'")
    else:
        raise ProblemError(
            f"factory is {spec!r}, but must be 'package.module:function' or 'path/to/file.py:function' "
            "(an importable module or a Python file, a colon, then the name of a function in it)"
        )
    function: Any = module
    for depth, part in enumerate(attribute_path.split(".")):
        if not hasattr(function, part):
            owner = module_name if depth == 0 else f"{module_name}:{'.'.join(attribute_path.split('.')[:depth])}"
            known = [name for name in dir(function) if not name.startswith("_")]
            close = closest_names(part, known)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ProblemError(f"factory '{spec}': '{owner}' has no attribute '{part}'{hint}")
        function = getattr(function, part)
    if not callable(function):
        raise ProblemError(
            f"factory '{spec}': '{attribute_path}' is a {type(function).__name__}, "
            "but must be a callable that returns " + returns
        )
    return function
