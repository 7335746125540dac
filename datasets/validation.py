"""Validate JSON-shaped data against a pydantic model, turning the first
error into a `ProblemError` that names the JSON path (``points[2].batch``),
the rule broken and the value given."""

from __future__ import annotations

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
    """``('points', 2, 'batch')`` -> ``points[2].batch``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _describe(error: dict[str, Any]) -> str:
    msg = error["msg"]
    if error["type"] == "missing":
        return "is required but missing"
    if error["type"] == "extra_forbidden":
        return "is not a known field"
    if "input" in error and error["type"] not in ("model_type", "dict_type"):
        given = error["input"]
        text = repr(given)
        if len(text) > 60:
            text = text[:57] + "..."
        return f"{msg[0].lower() + msg[1:]} (given {text})"
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
