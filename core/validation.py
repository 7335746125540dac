"""Validate JSON-shaped data against a pydantic model, turning the first
error into a `ProblemError` that names the JSON path (``points[2].batch``),
or another location the caller names (a CSV file's row and column), the rule
broken and the value given; and the base of the file schemas."""

from __future__ import annotations

import json
import numbers
import re
import reprlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic

from thrifty.core.errors import ProblemError

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

__all__ = ["FieldPathError", "FileSchema", "json_path", "validate_model", "problem_of", "short_value", "json_object",
           "without_unset", "RECORD_CONFIG"]

M = TypeVar("M", bound=pydantic.BaseModel)


class FileSchema(pydantic.BaseModel):
    """The base of a data file's schema: frozen, unknown keys rejected (a
    misspelt optional key would otherwise be silently ignored).

    `to_json` is the file's content: the fields a file gave (or a writer set),
    so loading and dumping a file gives back the same data, and a default
    left out stays out.
    """

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", defer_build=True)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_unset=True)


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


# A bounded repr: a YAML file's aliases can nest a list of 9 lists of 9 ... (a
# "billion laughs"), whose full repr would take minutes and gigabytes.
_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 3, 40, 40
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = 4


def short_value(value: Any) -> str:
    """The value given, short, for a message: huge integers and floats in
    exponent form, containers and strings cut."""
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int) and abs(value) >= 10**12:
        return f"{float(value):.3g}" if abs(value) < 10**308 else f"an integer of {_digits(value)} digits"
    if isinstance(value, float):
        return f"{value:g}"
    text = _SHORT.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _digits(value: int) -> str:
    """Roughly how many digits, without `str` (Python refuses more than 4,300)."""
    return f"about {int(abs(value).bit_length() * 0.30103):,}"


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _describe(error: ErrorDetails) -> str:
    msg = error["msg"]
    kind = error["type"]
    if kind == "missing":
        return "is required but missing"
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind in _BOUNDS and "input" in error:  # Optuna's shape: what was given, what is required
        key, words = _BOUNDS[kind]
        return f"is {short_value(error['input'])}, but must be {words} {_number(error['ctx'][key])}"
    if kind == "finite_number" and "input" in error:
        return f"is {short_value(error['input'])}, but must be a finite number"
    if kind == "value_error":
        msg = msg.removeprefix("Value error, ")
    if "input" in error and kind not in ("model_type", "dict_type"):
        return f"{msg[0].lower() + msg[1:]} (given {short_value(error['input'])})"
    return msg[0].lower() + msg[1:]


# pydantic names the member of a union (and a validator function) inside an
# error's location: ``('batch_sizes', 'list[function-before[...]]', 0)``. Such
# a tag is not part of the JSON path.
_UNION_TAG = re.compile(r"^(function-[a-z]+\[|(list|literal|dict|tuple|set|nullable)\[|constrained-|lax-)")


def _is_tag(part: Any) -> bool:
    return isinstance(part, str) and _UNION_TAG.match(part) is not None


def _field(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The location up to its first union tag: every member's error of one union is one field's."""
    for i, part in enumerate(loc):
        if _is_tag(part):
            return loc[:i]
    return loc


def _first_error(errors: list[ErrorDetails]) -> ErrorDetails:
    """The error to report: the first, except that a list given to a field
    that is a string or a list (``batch_sizes``, ``instance_type``) is
    reported by the list member of the union ("batch_sizes[0]: is 0, ..."),
    not by the string member ("input should be 'gpu_pow2' or 'pow2'")."""
    first = errors[0]
    loc = first["loc"]
    if not (loc and _is_tag(loc[-1]) and isinstance(first.get("input"), list)):
        return first
    at = len(loc) - 1
    for error in errors[1:]:
        other = error["loc"]
        if other[:at] == loc[:at] and len(other) > at and str(other[at]).startswith("list["):
            return error
    return first


_JSON_TYPES = frozenset({bool, int, float, str, type(None)})


def _plain(data: Any) -> Any:
    """`data` as JSON would give it: numbers of other types (numpy's, from Python code that builds a problem)
    as int or float, tuples and numpy arrays as lists; strict mode refuses anything else. Bools stay bools.
    (A container of JSON's own values only is returned as it is: a saved allreduce model holds 70,000.)"""
    if isinstance(data, dict):
        if _JSON_TYPES.issuperset(map(type, data.values())):
            return data
        return {k: v if type(v) in _JSON_TYPES else _plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        if type(data) is list and _JSON_TYPES.issuperset(map(type, data)):
            return data
        return [v if type(v) in _JSON_TYPES else _plain(v) for v in data]
    if isinstance(data, (bool, int, float, str)) or data is None:
        return data
    kind = getattr(getattr(data, "dtype", None), "kind", None)
    if kind in ("b", "i", "u", "f") and hasattr(data, "tolist"):  # a numpy scalar or array: Python's values
        return data.tolist()
    if isinstance(data, numbers.Integral):
        return int(data)
    if isinstance(data, numbers.Real):
        return float(data)
    return data


def validate_model(model: type[M], data: Any, source: str | None = None,
                   path_of: Callable[[tuple[Any, ...]], str] = json_path, *, strict: bool = True) -> M:
    """`model.model_validate(data)`, with a `ProblemError` naming the JSON path;
    `path_of` names the location of a field instead (``('seconds',)`` ->
    ``row 3 (line 4), field 'seconds'`` for a row of a CSV file).

    `strict` (pydantic's strict mode, the default): a value must have its
    field's JSON type, so ``true`` or ``"1024"`` given for a number, or ``1``
    for a flag, is refused rather than read as 1, 1024 or true (an integer is
    still a number; so is a numpy number, and a tuple is a list). A CSV row,
    whose fields are all text, is read with ``strict=False``."""
    if strict:
        try:
            data = _plain(data)
        except RecursionError:
            raise ProblemError("is nested too deeply", path=path_of(()), source=source) from None
    try:
        return model.model_validate(data, strict=strict)
    except pydantic.ValidationError as e:
        raise problem_of(e, source, path_of) from None


def problem_of(error: pydantic.ValidationError, source: str | None = None,
               path_of: Callable[[tuple[Any, ...]], str] = json_path) -> ProblemError:
    """The `ProblemError` that says what pydantic's `error` says first: the
    path of the bad field (`path_of` its location), the rule broken and the
    value given, and how many more fields are bad. For models validated
    another way than `validate_model` (a model's own constructor, JSON text)."""
    errors = error.errors(include_url=False)
    first = _first_error(errors)
    extra = first["type"] == "extra_forbidden"  # there the last part is the user's own key
    loc = tuple(p for i, p in enumerate(first["loc"])
                if not (_is_tag(p) and not (extra and i == len(first["loc"]) - 1)))
    more = len({_field(e["loc"]) for e in errors}) - 1  # a union's members: one field
    suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, FieldPathError):
        message, loc = cause.message, loc + cause.loc
    else:
        message = _describe(first)
    return ProblemError(message + suffix, path=path_of(loc), source=source)


# The config of the runtime's records and run-log events, frozen pydantic dataclasses (validated when made,
# made with positional arguments as dataclasses are): their schemas are built on first use, not at import,
# and they may hold objects of the runtime's own classes (a machine, a path).
RECORD_CONFIG = pydantic.ConfigDict(defer_build=True, arbitrary_types_allowed=True)


_ADAPTERS: dict[type, pydantic.TypeAdapter[Any]] = {}  # by record class, each made on its first use


def without_unset(data: dict[str, Any], *names: str) -> dict[str, Any]:
    """`data` (a record's serialization) without the keys `names` whose value
    is None: a field a record writes only when it is known, so that records
    written before it existed read the same."""
    for name in names:
        if data.get(name) is None:
            data.pop(name, None)
    return data


def json_object(record: Any) -> dict[str, Any]:
    """The JSON object of a record that is a pydantic dataclass (a run-log
    event, a run's result): pydantic's serialization of its fields and
    computed fields, by their JSON names (serialization aliases), with
    Python values that `json.dumps` writes as they are (a tuple is a list;
    an infinite projection stays ``Infinity``, as the run log always wrote
    it). The records' schemas are built on first use, not at import."""
    kind = type(record)
    adapter = _ADAPTERS.get(kind)
    if adapter is None:
        adapter = _ADAPTERS[kind] = pydantic.TypeAdapter(kind)
    return adapter.dump_python(record, by_alias=True)
