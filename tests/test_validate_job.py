"""``thrifty validate JOB`` and ``thrifty profile-scaling JOB`` on a job
(issue 35): a loop function or a `Trainer` factory is measured running its
own loop in the rank loop of ``thrifty run`` (real worker processes, gloo on
127.0.0.1) and predicted from its own profile (the job profile cache, else
profiled first). Tiny MLPs, 2 ranks at most, few iterations; correctness
only, no timing thresholds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from thrifty.perfmodels.job_profiles import CACHE_ENV, job_key, profile_path  # noqa: E402
from thrifty.perfmodels.profile import load_profile  # noqa: E402

from test_validate_command import cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOOP = "thrifty.runtime.training.examples:mlp_loop"
TRAINER = "thrifty.runtime.training.examples:tiny_mlp"
QUICK = ["--iterations", "3", "--warmup", "1", "--rounds", "1", "--device", "cpu"]
JOB_PARTS = ["iteration mean", "iteration p95", "forward (model)", "backward (with loss)", "exposed communication",
             "backward + exposed comm.", "step and the rest of the loop"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _check_job_result(result: dict, batches: list[int], iterations: int) -> None:
    """A job's configuration: its iterations measured per rank and in parts, beside the prediction."""
    measured, predicted = result["measured"], result["predicted"]
    assert result["batches"] == batches and measured["timed_iterations"] == iterations
    assert len(measured["rank_mean_s"]) == len(batches)
    assert measured["mean_s"] >= max(measured["rank_mean_s"]) > 0  # per iteration the slowest rank's
    assert predicted["world_size"] == len(batches) and predicted["mean_s"] > 0
    assert result["error"] == pytest.approx(predicted["mean_s"] / measured["mean_s"] - 1)
    parts = {row["part"]: row for row in result["parts"]}
    assert list(parts) == JOB_PARTS
    # the job's clock marks split the backward pass from the exchange after it: every part is measured
    assert all(row["measured_s"] is not None and row["measured_s"] >= 0 for row in result["parts"])
    assert measured["compute_s"] > 0 and measured["forward_s"] > 0
    assert measured["backward_s"] == parts["backward + exposed comm."]["measured_s"]
    # each rank's parts add up to its whole iteration, so the slowest ones' reach the slowest iteration's mean
    assert measured["forward_s"] + measured["backward_s"] + measured["step_s"] >= measured["mean_s"] - 1e-9
    assert parts["exposed communication"]["predicted_s"] == predicted["exposed_comm_s"]


def test_a_loop_function_is_measured_in_its_own_loop_and_predicted_from_its_own_profile(cache, tmp_path, capsys):
    saved = tmp_path / "loop.json"
    code, out, err = cli(["validate", LOOP, "--job-args", '{"hidden": 12}', "--config", "local@4+local@8", *QUICK,
                           "--json", "--save-profile", str(saved)], capsys)
    assert code == 0, err
    document = json.loads(out)
    assert (document["kind"], document["job_args"], document["model"]) == ("job", {"hidden": 12}, "mlp-loop")
    assert document["warmup"] >= 4  # the clock marks' own warm-up comes first
    _check_job_result(document["configs"][0], [4, 8], iterations=3)
    # profiled first, from the job itself at the configuration's batches, and kept in the job profile cache
    assert document["profile"]["source"] == "measured here"
    cached = profile_path(job_key(LOOP, {"hidden": 12}), device="cpu")
    profile = load_profile(cached)
    assert sorted(p.batch for p in profile.points) == [4, 8] and profile.extra["job"]["args"] == {"hidden": 12}
    assert load_profile(saved).points == profile.points

    # the next validation of the same job prices it from the cache, without profiling it again
    code, out, err = cli(["validate", LOOP, "--job-args", '{"hidden": 12}', "--config", "local@8", *QUICK, "--json"],
                          capsys)
    assert code == 0, err
    document = json.loads(out)
    assert document["profile"] == {"source": "job profile cache", "path": str(cached),
                                   "command": profile.provenance.command}
    _check_job_result(document["configs"][0], [8], iterations=3)


def test_a_trainer_factory_of_thrifty_run_is_validated_as_its_loop(cache, capsys):
    """What ``thrifty run`` trains, validate measures: no "must return a Workload" (exit 2) any more."""
    code, out, err = cli(["validate", TRAINER, "--config", "local@6+local@2", *QUICK], capsys)
    assert code == 0, err
    assert "tiny-mlp on 1xlocal@6+1xlocal@2: 2 ranks" in out
    for part in JOB_PARTS:
        assert part in out
    assert "compute profile: measured here" in out
    assert "profiling its loop here first (batches 2, 6" in err and "round 1/1: local@6+local@2:" in err


def loop_that_raises_on_rank_1(ctx):
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = ctx.prepare_model(model)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    for inputs, targets in ctx.prepare_loader(data):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        if ctx.rank == 1 and ctx.iteration == 5:
            raise KeyError("no such column")
        ctx.report(checkpoint={"model": model})


def test_a_loop_that_fails_is_one_line_naming_the_rank_and_its_log(cache, capsys):
    spec = "test_validate_job:loop_that_raises_on_rank_1"
    code, _out, err = cli(["validate", spec, "--config", "local@4+local@4", *QUICK, "--no-progress"], capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert f"rank 1 failed: job '{spec}' (rank 1) raised KeyError: 'no such column' (log: " in err
    assert Path(err.split("(log: ")[1].split(")")[0]).is_file()


@pytest.mark.parametrize("argv, says", [
    (["validate", "thrifty.runtime.training.examples:nope", "--config", "local@4"], "has no attribute 'nope'"),
    (["validate", LOOP, "--job-args", '{"nope": 1}', "--config", "local@4"], "cannot take the arguments"),
    (["validate", LOOP, "--job-args", "[1]", "--config", "local@4"], "--job-args is a JSON list"),
    (["validate", "thrifty.runtime.measure.zoo:mlp", "--job-args", "{}", "--config", "local@4"],
     "is a Workload factory, which the worker processes call without arguments"),
    (["profile-scaling", "thrifty.runtime.training.examples:nope", "--world-sizes", "1,2", "--batch", "4",
      "--out", "x.json"], "has no attribute 'nope'"),
    (["profile-scaling", LOOP, "--job-args", '{"nope": 1}', "--world-sizes", "1,2", "--batch", "4", "--out",
      "x.json"], "cannot take the arguments"),
])
def test_bad_jobs_are_one_line_errors_before_any_process_starts(argv, says, cache, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _out, err = cli(argv, capsys)
    assert code == 2, err
    assert says in err and len(err.strip().splitlines()) == 1, err


def test_profile_scaling_times_a_loop_function_and_the_solver_reads_its_profile(tmp_path, capsys):
    out = tmp_path / "mlp-loop__local-a.json"
    code, _out, err = cli(["profile-scaling", LOOP, "--job-args", '{"hidden": 12}', "--world-sizes", "1,2",
                            "--batch", "8", "--out", str(out), "--instance-type", "local-a", "--iterations", "3",
                            "--warmup", "1", "--device", "cpu", "--timeout", "120", "--no-progress"], capsys)
    assert code == 0, err
    document = json.loads(out.read_text())
    assert [p["gpus"] for p in document["points"]] == [1, 2] and all(p["repeats"] == 3 for p in document["points"])
    assert all(p["iteration_s"] > 0 for p in document["points"]) and document["startup_s"] > 0
    assert document["iteration"].startswith("one iteration of the job's own loop")
    assert "measured from the job" in document["provenance"]["notes"]
    assert document["provenance"]["command"].startswith(f"thrifty profile-scaling {LOOP} --job-args")
    problem = tmp_path / "tuning.json"
    problem.write_text(json.dumps({
        "kind": "tuning", "model": str(out), "instance_type": "local-a",
        "catalog": str(ROOT / "datasets" / "examples" / "local-demo-catalog.json"),
        "stages": [{"trials": 2, "iters": 4}, {"trials": 1, "iters": 8}], "deadline_s": 60,
        "billing": "per_instance", "cloud": {"min_billed_s": 0}, "samples": 1, "max_instances": 2}))
    code, solved, err = cli(["solve", str(problem), "--json"], capsys)
    assert code == 0, err
    plan = json.loads(solved)
    assert str(out.name) in json.dumps(plan)  # the plan names the profile it was priced with
