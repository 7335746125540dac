"""Published measurements thrifty's predictions are checked against.

``datasets/published/srifty-case-studies.json``: every configuration that
Srifty (MLSys 2022) section 5.2 ran on EC2 in its seven case studies, with the
latency, cost or job time the authors measured (format
``thrifty.published_results/1``, provenance ``published``). These are
validation data: no model or parameter of thrifty may be fitted to them, and
`benchmarks/srifty_cases.py` reports, per case, which shipped profiles were
calibrated on one of these rows anyway (the derived T4, M60-AlexNet and DLRM
profiles; see ``datasets/profiles/derived/README.md``).

A configuration is written as in the paper, ``<count><family>@<batch per
instance>`` joined by ``+`` (``4p3@512+4g4dn@32``); `parse_paper_config`
reads it against the instance types of the case's problem, where each family
names one type.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from thrifty.core.errors import ProblemError
from thrifty.core.io import read_json
from thrifty.datasets.paths import DATA_DIR
from thrifty.core.validation import FieldPathError, FileSchema, validate_model

__all__ = ["PUBLISHED_FORMAT", "CaseStudies", "CaseStudy", "PaperResult", "load_case_studies", "parse_paper_config"]

PUBLISHED_FORMAT = "thrifty.published_results/1"
CASE_STUDIES = DATA_DIR / "published" / "srifty-case-studies.json"
_TERM = re.compile(r"^(\d+)([a-z][a-z0-9]*)@(\d+)$")


class PaperResult(FileSchema):
    systems: str = Field(min_length=1)  # which systems chose this configuration
    config: str = Field(pattern=r"^\d+[a-z][a-z0-9]*@\d+(\+\d+[a-z][a-z0-9]*@\d+)*$")
    measured: float = Field(gt=0)  # in the case's metric
    measured_usd: float | None = Field(default=None, gt=0)  # the job's cost (metric "job")


class CaseStudy(FileSchema):
    case: str  # the problem file's stem in datasets/examples/
    metric: Literal["s/iter", "cents/iter", "job"]  # "job": seconds for the problem's iterations
    srifty_unsat: bool = False  # Srifty proved no configuration meets the limits
    results: list[PaperResult] = Field(min_length=1)

    @model_validator(mode="after")
    def _job_cost_given(self) -> "CaseStudy":
        for i, r in enumerate(self.results):
            if (self.metric == "job") != (r.measured_usd is not None):
                raise FieldPathError(("results", i, "measured_usd"),
                                     "required exactly when the metric is 'job'")
        return self

    @property
    def papers_choice(self) -> PaperResult | None:
        """Srifty's own configuration (None where Srifty answered UNSAT)."""
        return None if self.srifty_unsat else self.results[0]

    def measured_text(self, result: PaperResult) -> str:
        """The paper's measurement of `result` as the paper prints it."""
        if self.metric == "s/iter":
            return f"{result.measured:g} s/iter"
        if self.metric == "cents/iter":
            return f"{result.measured:g} cents/iter"
        return f"{result.measured:g} s, ${result.measured_usd:g}"

    def seconds_per_iter(self, result: PaperResult, rate_usd_per_hour: float, iterations: int) -> float:
        """The paper's measurement as seconds per iteration: a cost per
        iteration at the configuration's hourly rate, a job's time over its
        iterations."""
        if self.metric == "s/iter":
            return result.measured
        if self.metric == "cents/iter":
            return result.measured / 100 * 3600 / rate_usd_per_hour
        return result.measured / iterations

    def in_metric(self, seconds_per_iter: float, rate_usd_per_hour: float, iterations: int) -> str:
        """A predicted iteration time in this case's metric (the inverse of `seconds_per_iter`)."""
        if self.metric == "s/iter":
            return f"{seconds_per_iter:.3f} s/iter"
        if self.metric == "cents/iter":
            return f"{rate_usd_per_hour * seconds_per_iter / 36:.4f} cents/iter"
        total = iterations * seconds_per_iter
        return f"{total:.0f} s, ${rate_usd_per_hour * total / 3600:.2f}"


class PublishedProvenance(FileSchema):
    kind: Literal["published"]
    source: str = Field(min_length=1)
    notes: str = ""


class CaseStudies(FileSchema):
    format: Literal["thrifty.published_results/1"]
    provenance: PublishedProvenance
    cases: list[CaseStudy] = Field(min_length=1)


def load_case_studies(path: str | Path = CASE_STUDIES) -> list[CaseStudy]:
    """The shipped Srifty 5.2 case studies, as printed in the paper."""
    return validate_model(CaseStudies, read_json(path), source=str(path)).cases


def parse_paper_config(config: str, type_names: list[str]) -> list[tuple[str, int, int]]:
    """``4p3@512+4g4dn@32`` -> ``[("p3.8xlarge", 4, 512), ("g4dn.8xlarge", 4, 32)]``:
    each family (the name before the dot) must name exactly one of `type_names`."""
    out = []
    for term in config.split("+"):
        m = _TERM.match(term.strip())
        if m is None:
            raise ProblemError(f"'{term}' is not <count><family>@<batch>", path="config")
        family = m.group(2)
        names = [n for n in type_names if n.split(".")[0] == family]
        if len(names) != 1:
            raise ProblemError(f"family '{family}' names {len(names)} of the case's types "
                               f"({', '.join(type_names)}); it must name one", path="config")
        out.append((names[0], int(m.group(1)), int(m.group(3))))
    return out
