"""Profiles from the job itself (issue 35): ``thrifty profile JOB`` times a
user's own loop function, writes the solver's profile format into the job
profile cache keyed by the job's code and arguments, and ``thrifty solve``
prices a problem that names the job with it, naming the types it cannot
price and the command that measures them."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from thrifty.perfmodels.job_profiles import CACHE_ENV, job_key, profile_path
from thrifty.perfmodels.profile import load_profile
from thrifty.runtime import cli
from thrifty.solver import solve

LOOP = textwrap.dedent('''
    import torch
    from torch.utils.data import TensorDataset


    def train(ctx, lr=0.1, width=16):
        model = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, 10)
        model = ctx.prepare_model(model)
        data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        for inputs, targets in ctx.prepare_loader(data):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            ctx.report({"loss": loss.item()})
''')
ARGS = {"width": 8}
SPEC = "tinyloop_jobs:train"


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny loop's package on sys.path, profiled once through the CLI as
    measured on g4dn.xlarge, into a cache of its own."""
    root = tmp_path_factory.mktemp("jobprof")
    (root / "tinyloop_jobs.py").write_text(LOOP)
    sys.path.insert(0, str(root))
    patch = pytest.MonkeyPatch()
    patch.setenv(CACHE_ENV, str(root / "cache"))
    try:
        code = cli.main(["profile", SPEC, "--job-args", json.dumps(ARGS), "--instance-type", "g4dn.xlarge",
                         "--batches", "2,4", "--repeats", "2", "--warmup", "1", "--rounds", "1", "--no-progress"])
        assert code == 0
        yield root
    finally:
        patch.undo()
        sys.path.remove(str(root))
        sys.modules.pop("tinyloop_jobs", None)


@pytest.fixture
def cache(profiled: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(profiled / "cache"))
    monkeypatch.syspath_prepend(str(profiled))
    return profiled


def _problem(*types: str) -> dict:
    return {"kind": "training", "job": SPEC, "job_args": ARGS, "global_batch": 4, "iterations": 100,
            "batch_sizes": "pow2", "instances": [{"instance_type": t, "quota": 2} for t in types]}


def test_a_profiled_loop_is_the_solvers_profile_format_and_says_its_job(cache: Path) -> None:
    path = profile_path(job_key(SPEC, ARGS), instance_type="g4dn.xlarge")
    profile = load_profile(path)  # the solver's reader
    assert profile.device == "T4"  # the catalog's device of the type
    assert [p.batch for p in profile.points] == [2, 4]
    assert all(p.forward_s > 0 and p.backward_s > 0 for p in profile.points)
    assert {layer.name for layer in profile.layers} == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert profile.layers[-1].ready_frac >= profile.layers[0].ready_frac
    assert profile.provenance.kind == "measured" and SPEC in (profile.provenance.notes or "")
    assert profile.extra["job"] == {"spec": SPEC, "args": ARGS, "key": job_key(SPEC, ARGS)}
    assert "--job-args" in (profile.provenance.command or "")


def test_a_problem_naming_the_job_solves_with_its_cached_profile(cache: Path) -> None:
    plan = solve(_problem("g4dn.xlarge"))
    profile = load_profile(profile_path(job_key(SPEC, ARGS), instance_type="g4dn.xlarge"))
    # the tiny loop's iteration is well under a millisecond; the shipped profiles price no such model
    assert 0 < plan.predicted.iteration_s < 0.05
    assert plan.predicted.iteration_s >= min(p.forward_s + p.backward_s for p in profile.points)


def test_a_type_without_a_profile_is_named_with_the_command_to_measure_it(cache: Path, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(_problem("g4dn.xlarge", "p3.2xlarge")))
    assert cli.main(["solve", str(path)]) == 2
    err = capsys.readouterr().err
    assert "p3.2xlarge (V100)" in err and "g4dn.xlarge (" not in err
    assert f"thrifty profile {SPEC} --job-args '{json.dumps(ARGS)}' --instance-type TYPE" in err
    assert "--cluster CLUSTER --instance-types p3.2xlarge" in err
    assert len(err.strip().splitlines()) == 1


def test_the_key_follows_the_jobs_source_and_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "keypkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('hashing a job must not import its package')\n")
    (package / "jobs.py").write_text(LOOP)
    monkeypatch.syspath_prepend(str(tmp_path))
    key = job_key("keypkg.jobs:train", ARGS)
    assert "keypkg" not in sys.modules
    assert job_key("keypkg.jobs:train", {"a": 1, "width": 8}) == job_key("keypkg.jobs:train", {"width": 8, "a": 1})
    assert job_key("keypkg.jobs:train", {"width": 9}) != key
    (package / "jobs.py").write_text(LOOP.replace("lr=0.1", "lr=0.2"))
    assert job_key("keypkg.jobs:train", ARGS) != key
    (package / "jobs.py").write_text(LOOP)
    assert job_key("keypkg.jobs:train", ARGS) == key


def test_an_edited_job_misses_the_cache(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "tinyloop_jobs.py").write_text(LOOP.replace("momentum=0.9", "momentum=0.8"))
    monkeypatch.syspath_prepend(str(tmp_path))  # the edited module is found first
    monkeypatch.delitem(sys.modules, "tinyloop_jobs", raising=False)
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(_problem("g4dn.xlarge")))
    assert cli.main(["solve", str(path)]) == 2
    assert "no profile for instance type g4dn.xlarge (T4)" in capsys.readouterr().err


def test_solve_with_a_job_imports_neither_torch_nor_the_job(cache: Path, tmp_path: Path) -> None:
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(_problem("g4dn.xlarge")))
    code = ("import sys; from thrifty.runtime import cli; code = cli.main(['solve', sys.argv[1]]); "
            "assert code == 0, code; "
            "print(sorted(m for m in ('torch', 'tinyloop_jobs') if m in sys.modules))")
    env = {**__import__("os").environ, CACHE_ENV: str(cache / "cache"), "PYTHONPATH": str(cache)}
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_the_trainer_short_form_and_a_workload_resolve_through_one_path() -> None:
    from thrifty.runtime.measure import profile_job, resolve_target
    from thrifty.runtime.measure.zoo import Workload

    workload = resolve_target("thrifty.runtime.measure.zoo:mlp")
    assert not workload.is_job and isinstance(workload.workload, Workload)
    trainer = resolve_target("thrifty.runtime.training.examples:tiny_mlp", {"hidden": 8})
    assert trainer.is_job  # a Trainer factory: run as trainer_loop through the profiling context
    profile = profile_job(trainer, model_name="tiny-mlp", batches=[2, 4], repeats=2, warmup=1, rounds=1)
    assert [p.batch for p in profile.points] == [2, 4] and len(profile.layers) == 4
    assert profile.extra["job"]["args"] == {"hidden": 8}


def test_bad_job_inputs_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cases = [
        (["profile", "thrifty.runtime.training.examples:mlp_loop", "--job-args", "[1]"], "--job-args is a JSON list"),
        (["profile", "thrifty.runtime.measure.zoo:mlp", "--batches", "1,2"], "give --out PROFILE.json"),
        (["profile", "thrifty.runtime.training.examples:mlp_loop", "--job-args", '{"nope": 1}'],
         "cannot take the arguments"),
    ]
    for argv, says in cases:
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
    path = tmp_path / "problem.json"
    path.write_text(json.dumps({**_problem("g4dn.xlarge"), "job": None, "model": "mlp"}))
    assert cli.main(["solve", str(path)]) == 2
    assert "job_args" in capsys.readouterr().err
