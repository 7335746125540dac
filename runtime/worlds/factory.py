"""Functions named ``package.module:function``: how a worker process finds
the code it runs (a trainer, a workload, a rank's entry point). Shared by the
runtime and the measurement tools; importing this module imports no torch."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from thrifty.core.errors import ProblemError, closest_names
from thrifty.core.optional import import_named

__all__ = ["resolve_factory"]

_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"


_SPEC = re.compile(rf"^({_DOTTED}):({_DOTTED})$")



def resolve_factory(spec: str, returns: str = "a value") -> Callable[..., Any]:
    """Resolve ``package.module:function`` (the function may be a dotted
    attribute path, ``module:Class.method``) to that callable. A bad spec, a
    module that cannot be imported, a missing or non-callable attribute is a
    `ProblemError` naming the spec (`returns` says, in that error, what the
    callable should return)."""
    match = _SPEC.match(spec.strip()) if isinstance(spec, str) else None
    if match is None:
        raise ProblemError(
            f"factory is {spec!r}, but must be 'package.module:function' "
            "(an importable module, a colon, then the name of a function in it)"
        )
    module_name, attribute_path = match.groups()
    module = import_named(module_name, f"factory '{spec}'")
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
