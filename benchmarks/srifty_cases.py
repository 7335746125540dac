"""The Srifty 5.2 case studies as a validation benchmark (issue 18).

For each case (``datasets/examples/srifty-case*.json``) it prints:

- the paper's chosen configuration with the time or cost the authors measured
  on EC2 (``datasets/published/srifty-case-studies.json``);
- thrifty's plan for the same problem, with its predicted time and cost;
- thrifty's prediction for the paper's configuration, and its error against
  the paper's measurement;
- which shipped profiles of the case were calibrated on a row of the paper's
  case studies, so the reader sees which comparisons are independent: "own"
  when a profile of the configuration was calibrated on a row of the same case
  (circular), "case N" when on another case's row, "-" when on none.

A second table does the same for every configuration the paper measured
(Srifty's and the baselines'), with the MAPE of thrifty's predicted iteration
time by class (independent, calibrated on another case, circular).

Each prediction is made twice in one run, side by side: with the allreduce
model thrifty ships for cloud types (``default_bandwidth_model()``; its
``source`` per type is printed) and with the analytic ring at the rated
network (`AnalyticAllreduce`, what every EC2 plan used before). Measured
latencies convert to seconds per iteration with the paper's prices
(``datasets/catalog/srifty-2022.json``): ``cents/iter = rate x t / 36``; job
times divide by the problem's iterations (launch time is 0 in these problems).

Run: ``python benchmarks/srifty_cases.py [--json results.json]`` (about 10 s).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from thrifty.core.io import atomic_write_text, read_json
from thrifty.datasets.paths import DATA_DIR, profile_files
from thrifty.datasets.published import CaseStudy, PaperResult, load_case_studies, parse_paper_config
from thrifty.perfmodels.bandwidth import AnalyticAllreduce, BandwidthModel
from thrifty.perfmodels.loading import default_bandwidth_model
from thrifty.solver.problem import TrainingProblem, load_problem
from thrifty.solver.solve import solve
from thrifty.solver.training import TrainingSpace

EXAMPLES = DATA_DIR / "examples"
CASE_TAG = re.compile(r"\[srifty-case(\d)\]")
console = Console(width=200)


@dataclass(frozen=True)
class Row:
    case: str
    systems: str
    config: str
    measured_s_per_iter: float
    predicted_s_per_iter: float  # with the shipped allreduce model
    analytic_s_per_iter: float  # with the analytic ring at the rated network
    calibrated_on: str  # "own", "case N, ...", or "-"
    allreduce_sources: str

    @property
    def error(self) -> float:
        return self.predicted_s_per_iter / self.measured_s_per_iter - 1

    @property
    def analytic_error(self) -> float:
        return self.analytic_s_per_iter / self.measured_s_per_iter - 1


def case_number(case: str) -> int:
    return int(re.match(r"srifty-case(\d)", case).group(1))  # type: ignore[union-attr]


def calibration_cases(model: str, devices: set[str]) -> set[int]:
    """The case studies whose rows calibrated the profiles of `model` on `devices`."""
    out: set[int] = set()
    for path in profile_files():
        m, _, device = path.stem.rpartition("__")
        if m == model and device in devices:
            inputs = read_json(path).get("provenance", {}).get("inputs", [])
            out |= {int(n) for text in inputs for n in CASE_TAG.findall(text)}
    return out


def calibration_label(case: str, cases: set[int]) -> str:
    if not cases:
        return "-"
    own = case_number(case) in cases
    others = ", ".join(f"case {n}" for n in sorted(cases - {case_number(case)}))
    return ("own" + (f" (+ {others})" if others else "")) if own else others


class CaseSpace:
    """One case's problem with a simulator per allreduce model."""

    def __init__(self, study: CaseStudy, bandwidth: BandwidthModel):
        self.study = study
        self.path = EXAMPLES / f"{study.case}.json"
        problem = load_problem(self.path)
        assert isinstance(problem, TrainingProblem)  # the case studies are training problems
        self.problem = problem
        self.space = TrainingSpace(self.problem, bandwidth=bandwidth)
        self.names = [c.itype.name for c in self.space.choices]

    def candidate(self, config: str):
        return self.space.candidate(parse_paper_config(config, self.names))

    def seconds_per_iter(self, result: PaperResult, candidate) -> float:
        """The paper's measurement, as seconds per iteration."""
        return self.study.seconds_per_iter(result, self.space.rate_per_hour(candidate), self.problem.iterations)

    def predict(self, candidate) -> float:
        return self.space.evaluate(candidate).iteration_s

    def sources(self, candidate) -> str:
        bw = self.space.simulator.bandwidth
        return ", ".join(sorted({f"{self.names[i].split('.')[0]}:{bw.source(self.space.choices[i].itype)}"
                                 for i, _, _ in candidate}))

    def calibrated_on(self, candidate) -> str:
        devices = {self.space.choices[i].itype.device for i, _, _ in candidate}
        return calibration_label(self.study.case, calibration_cases(self.space.model, devices))


def rows_of(study: CaseStudy, shipped: CaseSpace, analytic: CaseSpace) -> list[Row]:
    out = []
    for result in study.results:
        candidate = shipped.candidate(result.config)
        out.append(Row(study.case, result.systems, result.config, shipped.seconds_per_iter(result, candidate),
                       shipped.predict(candidate), analytic.predict(candidate), shipped.calibrated_on(candidate),
                       shipped.sources(candidate)))
    return out


def plan_text(space: CaseSpace) -> tuple[str, str, float]:
    """thrifty's plan for the case's problem: (configuration, prediction, solve seconds)."""
    t0 = time.perf_counter()
    plan = solve(space.problem, space=space.space)
    wall = time.perf_counter() - t0
    if not plan.feasible:
        need = plan.infeasibility.limits_needed()
        text = (f"fastest needs {need['limits.time_s']:.0f} s, ${need['limits.cost_usd']:.2f}"
                if "limits.time_s" in need and "limits.cost_usd" in need else "-")
        return "infeasible", text, wall
    p = plan.predicted
    config = plan.config.replace("xlarge", "xl")
    if space.study.metric == "s/iter":
        return config, f"{p.iteration_s:.3f} s/iter", wall
    if space.study.metric == "cents/iter":
        return config, f"{p.cost_usd / space.problem.iterations * 100:.4f} cents/iter", wall
    return config, f"{p.total_s:.0f} s, ${p.cost_usd:.2f}", wall


def case_table(spaces: list[tuple[CaseSpace, CaseSpace]], rows: dict[str, list[Row]]) -> Table:
    t = Table(title="Srifty 5.2 case studies: the paper's choice (measured on EC2) against thrifty "
                    "(shipped profiles and allreduce model)", show_lines=False)
    for col in ("case", "paper's choice", "paper measured", "thrifty's plan", "thrifty predicts (its plan)",
                "thrifty predicts (paper's choice)", "error", "analytic ring error", "profiles calibrated on",
                "allreduce", "solve s"):
        t.add_column(col, justify="right" if col in ("error", "analytic ring error", "solve s") else "left")
    for shipped, _ in spaces:
        study = shipped.study
        config, predicted, wall = plan_text(shipped)
        choice = study.papers_choice
        if choice is None:
            t.add_row(study.case, "UNSAT", "-", config, predicted, "-", "-", "-",
                      rows[study.case][0].calibrated_on, rows[study.case][0].allreduce_sources, f"{wall:.2f}")
            continue
        row = rows[study.case][0]
        candidate = shipped.candidate(choice.config)
        t.add_row(study.case, choice.config, study.measured_text(choice), config, predicted,
                  study.in_metric(row.predicted_s_per_iter, shipped.space.rate_per_hour(candidate),
                                  shipped.problem.iterations), f"{row.error:+.1%}",
                  f"{row.analytic_error:+.1%}", row.calibrated_on, row.allreduce_sources, f"{wall:.2f}")
    return t


def all_rows_table(rows: list[Row]) -> Table:
    t = Table(title="Every configuration the paper measured: seconds per iteration")
    for col in ("case", "systems", "config", "measured", "thrifty", "error", "analytic ring", "error ",
                "profiles calibrated on"):
        t.add_column(col, justify="left" if col in ("case", "systems", "config", "profiles calibrated on")
                     else "right")
    for r in rows:
        t.add_row(r.case, r.systems, r.config, f"{r.measured_s_per_iter:.4f}", f"{r.predicted_s_per_iter:.4f}",
                  f"{r.error:+.1%}", f"{r.analytic_s_per_iter:.4f}", f"{r.analytic_error:+.1%}", r.calibrated_on)
    return t


def mape_by_class(rows: list[Row]) -> dict[str, tuple[int, float, float]]:
    """MAPE (shipped model, analytic ring) of each calibration class and overall."""
    classes = {
        "independent (no profile calibrated on a case study)": [r for r in rows if r.calibrated_on == "-"],
        "calibrated on another case's row": [r for r in rows if r.calibrated_on.startswith("case")],
        "circular (calibrated on this case's rows)": [r for r in rows if r.calibrated_on.startswith("own")],
        "all": rows,
    }
    return {name: (len(rs), sum(abs(r.error) for r in rs) / len(rs), sum(abs(r.analytic_error) for r in rs) / len(rs))
            for name, rs in classes.items() if rs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write every row and the MAPEs to this file")
    args = parser.parse_args()
    shipped_bw, analytic_bw = default_bandwidth_model(), AnalyticAllreduce()
    spaces = [(CaseSpace(s, shipped_bw), CaseSpace(s, analytic_bw)) for s in load_case_studies()]
    rows = {s.study.case: rows_of(s.study, s, a) for s, a in spaces}
    flat = [r for rs in rows.values() for r in rs]
    console.print(case_table(spaces, rows))
    console.print(all_rows_table(flat))
    summary = Table(title="MAPE of thrifty's predicted iteration time against the paper's measurements")
    for col in ("rows", "configurations", "shipped allreduce model", "analytic ring"):
        summary.add_column(col, justify="right" if col != "rows" else "left")
    mapes = mape_by_class(flat)
    for name, (n, shipped, analytic) in mapes.items():
        summary.add_row(name, str(n), f"{shipped:.1%}", f"{analytic:.1%}")
    console.print(summary)
    if args.json:
        atomic_write_text(args.json, json.dumps({
            "rows": [{**asdict(r), "error": r.error, "analytic_error": r.analytic_error} for r in flat],
            "mape": {k: {"rows": n, "shipped": s, "analytic": a} for k, (n, s, a) in mapes.items()},
        }, indent=1))


if __name__ == "__main__":
    main()
