"""Where a prediction's figures came from, per instance type (issue 36).

Every plan rests on two kinds of figures of each machine type it considers:
its compute figures (forward, backward and step latency, from a compute or
scaling profile) and its allreduce figures (bus bandwidth and cap, from an
allreduce model). A `FigureSource` says where one of them came from:

- ``measured``: measured on the machine (a profile from ``thrifty profile``,
  a learned allreduce model fitted on probes of the type); `file` is what
  holds it and `machine`/`command` where and how it was measured;
- ``corrected``: corrected online from what a run measured, starting from
  `prior` (the online calibration of ``thrifty run`` builds these: a compute
  model added to the library whose provenance record has ``kind:
  "corrected"`` is reported so, with the record's ``notes`` and ``prior``;
  a corrected allreduce model answers ``provenance_of(itype)`` with its
  base model's answer ``.corrected(note)``);
- ``derived``: computed by a script from published figures (`script`);
- ``published``: a published measurement (`source` in `note`);
- ``analytic``: a formula on the catalog's rated figures, with no
  measurement or publication of the type behind it;
- ``stated``: given by the problem (a tuning problem's ``profile``
  rescales its curve) or by a file that does not say where its figures
  came from.

`fallback` is True when the models with a basis (measured or derived) for
figures of that kind passed the type on and the analytic ring answered it,
or when a file the problem named lacks the type and a shipped profile
answered it instead; `passed_over` says, for each model that passed it on,
why (the figure is then no better than its `kind`, whatever the problem
named). Each model that answers figures builds its own `FigureSource`
(`thrifty.perfmodels.bandwidth.BandwidthModel.provenance_of`,
`thrifty.perfmodels.library.ModelLibrary.source_of`): the choice of model
returns its provenance instead of falling back without a word.

`FigureSource` is a frozen pydantic model, the same record a plan holds
(`thrifty.solver.plan.TypeProvenance`), so what a model says and what a plan
file says are one type.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, get_args

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from thrifty.datasets.paths import DATA_DIR

__all__ = ["SourceKind", "SOURCE_KINDS", "FigureSource", "TypeSources", "from_record", "display_path"]

SourceKind = Literal["measured", "corrected", "derived", "published", "analytic", "stated"]
SOURCE_KINDS: tuple[str, ...] = get_args(SourceKind)


class FigureSource(BaseModel):
    """Where one kind of figure of one instance type came from (module docstring).

    `model` names what answered ("compute profile", "learned allreduce
    model", "derived cloud allreduce model", "analytic ring", ...). Frozen;
    its JSON (``model_dump()``) leaves out the keys in `_omit_empty` while
    they are None or empty, and reads back to the same source (a plan's
    ``provenance``, `thrifty.solver.plan.TypeProvenance`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)
    _omit_empty: ClassVar[frozenset[str]] = frozenset(
        {"file", "machine", "command", "script", "date", "note", "passed_over", "prior"})

    kind: SourceKind
    model: str
    fallback: bool = False
    file: str | None = None
    machine: str | None = None
    command: str | None = None
    script: str | None = None
    date: str | None = None
    note: str | None = None
    passed_over: list[str] = Field(default_factory=list)
    prior: "FigureSource | None" = None  # what a corrected (or rescaled) figure started from

    @model_serializer(mode="wrap")
    def _without_empty(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if not (k in self._omit_empty and v in (None, "", []))}

    def passed_on(self, why: str, named: bool = False) -> "FigureSource":
        """This answer, reached after a model passed the type on for `why`:
        a fallback when the analytic ring answers, or when the model that
        passed it on was one a problem named (`named`)."""
        return self.model_copy(update={"passed_over": [why, *self.passed_over],
                                       "fallback": self.fallback or named or self.kind == "analytic"})

    def with_note(self, note: str) -> "FigureSource":
        return self.model_copy(update={"note": note})

    def corrected(self, note: str, **where: Any) -> "FigureSource":
        """The figure corrected online from what a run measured (`note`: by
        what evidence), with this one as its prior: the hook of online
        calibration (``thrifty run``)."""
        return FigureSource(kind="corrected", model=self.model, note=note, prior=self, **where)

    def describe(self) -> str:
        """One line: ``derived (datasets/profiles/derived/resnet50__T4.json)``,
        ``analytic (analytic ring), FALLBACK: ...``, ``corrected online from ...``."""
        if self.kind == "corrected":
            text = "corrected online" + (f" ({self.note})" if self.note else "")
            return text + (f" from {self.prior.describe()}" if self.prior is not None else "")
        where = self.file or self.script or self.command
        text = f"{self.kind} ({self.model})" if self.kind == "analytic" else self.kind
        text += f" ({where})" if where else ""
        if self.machine and self.kind == "measured":
            text += f" on {self.machine}"
        if self.fallback:
            text += ", FALLBACK" + (f": {'; '.join(self.passed_over)}" if self.passed_over else "")
        return text


@dataclass(frozen=True)
class TypeSources:
    """The sources of one instance type's compute and allreduce figures."""

    compute: FigureSource
    allreduce: FigureSource


def from_record(record: Mapping[str, Any], model: str, file: str | None = None) -> FigureSource:
    """The `FigureSource` of a data file's provenance record (``{"kind":
    "measured", "command": ..., "machine": ...}``, `thrifty.perfmodels.profile.Provenance`
    dumped; a corrected model's record has ``kind: "corrected"``, and its
    ``prior``, when given, is the record it started from). An empty record
    (a file without one) is ``stated``; a kind it does not know is an error."""
    kind = record.get("kind")
    if not record:
        return FigureSource(kind="stated", model=model, file=file, note="the file does not say where it came from")
    if kind not in SOURCE_KINDS or kind in ("analytic", "stated"):
        raise ValueError(f"a provenance record's kind is {kind!r}, but must be one of measured, corrected, "
                         "derived, published")
    note = f"published: {record['source']}" if kind == "published" and record.get("source") else None
    if kind == "corrected" and isinstance(record.get("notes"), str):
        note = record["notes"]  # by what evidence (the calibration writes it)
    prior = record.get("prior")
    return FigureSource(
        kind=kind, model=model, file=file, machine=record.get("machine"), command=record.get("command"),
        script=record.get("script"), date=record.get("date"), note=note,
        prior=from_record(prior, model) if isinstance(prior, Mapping) else None)


def display_path(path: str | Path) -> str:
    """A file as a plan names it: a shipped data file by its place in the
    repository (``datasets/allreduce/cloud-derived-model.json``), any other
    by its absolute path (a plan outlives the folder it was solved in)."""
    resolved = Path(path).resolve()
    try:
        return str(Path(DATA_DIR.name) / resolved.relative_to(DATA_DIR.resolve()))
    except ValueError:
        return str(resolved)
