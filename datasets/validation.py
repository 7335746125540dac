"""Validate JSON-shaped data against a pydantic model, turning the first
error into a `ProblemError` that names the JSON path (``points[2].batch``),
the rule broken and the value given."""

from __future__ import annotations

import json

from typing import Any, TypeVar

import pydantic

from thrifty.datasets.errors import ProblemError

__all__ = ["FieldPathError", "json_path", "validate_model"]

M = TypeVar("M", bound=pydantic.BaseModel)


class FieldPathError(ValueError):
    """Raise from a pydantic model validator for a cross-field rule: `loc` is
    the path of the offending field, relative to the model being validated."""

    def __init__(self, loc: tuple[Any, ...], message: str):
        super().__init__(message)
        self.loc = tuple(loc)
        self.message = message


def json_path(loc: tuple[Any, ...]) -> str:
    """``('points', 2, 'batch')`` -> ``points[2].batch``; a key that is not a
    plain name (empty, spaces, control characters, dots) is quoted as JSON
    (``limits["a b"]``), so the path stays on one line and unambiguous."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).isidentifier() and str(part).isascii():
            out += ("." if out else "") + str(part)
        else:
            out += f"[{json.dumps(str(part))}]"
    return out or "(top level)"


_BOUNDS = {
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "less than"),
    "greater_than_equal": ("ge", "at least"),
    "greater_than": ("gt", "greater than"),
}


def _given(value: Any) -> str:
    """The value given, short: huge integers and floats in exponent form."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int) and abs(value) >= 10**12:
        return f"{float(value):.3g}" if abs(value) < 10**308 else f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, float):
        return f"{value:g}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _describe(error: dict[str, Any]) -> str:
    msg = error["msg"]
    kind = error["type"]
    if kind == "missing":
        return "is required but missing"
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind in _BOUNDS and "input" in error:  # Optuna's shape: what was given, what is required
        key, words = _BOUNDS[kind]
        return f"is {_given(error['input'])}, but must be {words} {_number(error['ctx'][key])}"
    if kind == "finite_number" and "input" in error:
        return f"is {_given(error['input'])}, but must be a finite number"
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
    if "input" in error and kind not in ("model_type", "dict_type"):
        return f"{msg[0].lower() + msg[1:]} (given {_given(error['input'])})"
    return msg[0].lower() + msg[1:]


def validate_model(model: type[M], data: Any, source: str | None = None) -> M:
    """`model.model_validate(data)`, with a `ProblemError` naming the JSON path."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as e:
        first = e.errors(include_url=False)[0]
        loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        more = len(e.errors()) - 1
        suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, FieldPathError):
            message, loc = cause.message, loc + cause.loc
        else:
            message = _describe(first)
        raise ProblemError(message + suffix, path=json_path(loc), source=source) from None
