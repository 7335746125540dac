"""The published case-study measurements (`datasets/published/`) and the
benchmark that checks thrifty's predictions against them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrifty.core.errors import ProblemError
from thrifty.datasets.published import CASE_STUDIES, load_case_studies, parse_paper_config
from thrifty.solver.problem import load_problem

from helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "datasets" / "examples"


def test_every_case_names_its_problem_and_every_configuration_reads_against_its_types():
    studies = load_case_studies()
    assert {s.case for s in studies} == {p.stem for p in EXAMPLES.glob("srifty-case*.json")}
    for study in studies:
        problem = load_problem(EXAMPLES / f"{study.case}.json")
        names = [c.instance_type for c in problem.instances]
        for result in study.results:
            terms = parse_paper_config(result.config, names)
            assert all(name in names and count > 0 and batch > 0 for name, count, batch in terms)
    assert next(s for s in studies if s.case == "srifty-case7-shufflenet").papers_choice is None
    assert next(s for s in studies if s.case == "srifty-case6-inception").papers_choice.config == "4p3@512+4g4dn@32"


def test_a_paper_configuration_is_read_against_the_case_types():
    types = ["p3.8xlarge", "g3.8xlarge", "g4dn.8xlarge"]
    assert parse_paper_config("4p3@512+4g4dn@32", types) == [("p3.8xlarge", 4, 512), ("g4dn.8xlarge", 4, 32)]
    with pytest.raises(ProblemError, match="not <count><family>@<batch>"):
        parse_paper_config("4p3+4g4dn@32", types)
    with pytest.raises(ProblemError, match="family 'g5' names 0"):
        parse_paper_config("1g5@64", types)


def test_a_job_case_needs_its_cost_and_the_error_names_the_field(tmp_path):
    doc = json.loads(CASE_STUDIES.read_text())
    del doc["cases"][6]["results"][1]["measured_usd"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ProblemError) as e:
        load_case_studies(bad)
    assert "cases[6].results[1].measured_usd" in str(e.value)


def test_the_benchmark_marks_profiles_calibrated_on_case_study_rows():
    bench = load_script(ROOT / "benchmarks" / "srifty_cases.py")
    # the T4 efficiency is calibrated on case 1's 1g4dn@128; AlexNet on M60 on case 3's 1g3@1024
    assert bench.calibration_label("srifty-case1-resnet50", bench.calibration_cases("resnet50", {"T4"})) == "own"
    assert bench.calibration_label("srifty-case3-alexnet", bench.calibration_cases("alexnet", {"M60"})) == "own"
    assert bench.calibration_label("srifty-case5-xlm", bench.calibration_cases("xlm", {"T4"})) == "case 1"
    assert bench.calibration_label("srifty-case2-vgg16", bench.calibration_cases("vgg16", {"M60"})) == "-"


def test_the_benchmark_converts_the_paper_metrics_to_seconds_per_iteration():
    bench = load_script(ROOT / "benchmarks" / "srifty_cases.py")
    from thrifty.perfmodels.bandwidth import AnalyticAllreduce

    studies = {s.case: s for s in load_case_studies()}
    dlrm = bench.CaseSpace(studies["srifty-case4-dlrm"], AnalyticAllreduce())
    result = studies["srifty-case4-dlrm"].results[0]  # 0.0024 cents per iteration on one g4dn.8xlarge at $0.72/h
    assert dlrm.seconds_per_iter(result, dlrm.candidate(result.config)) == pytest.approx(0.12)
    inception = bench.CaseSpace(studies["srifty-case6-inception"], AnalyticAllreduce())
    result = studies["srifty-case6-inception"].results[0]  # 259 s for 500 iterations
    assert inception.seconds_per_iter(result, inception.candidate(result.config)) == pytest.approx(0.518)
