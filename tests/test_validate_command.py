"""``thrifty validate``: real DDP iterations here against thrifty's prediction
(issue 18). Correctness only: what is measured, predicted and reported, and
that bad input is a clear message with exit code 2; no timing thresholds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from thrifty.perfmodels.profile import load_profile
from thrifty.runtime.cli import EXIT_BAD_INPUT, main


MLP = "thrifty.runtime.measure.zoo:mlp"
QUICK = ["--iterations", "3", "--warmup", "1", "--rounds", "1", "--device", "cpu"]
PARTS = ["iteration mean", "iteration p95", "forward (with loss)", "backward (compute)", "exposed communication",
         "backward + exposed comm.", "step (with zero_grad)"]

USER_MODULE = '''
import torch
from torch import nn


def tiny():
    """A user's factory: (model, make_batch, loss_fn), no shipped profile."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def make_batch(batch):
        return torch.randn(batch, 32), torch.randint(0, 4, (batch,))

    return model, make_batch, nn.functional.cross_entropy


def raises():
    raise RuntimeError("the data folder is missing")


def not_a_workload():
    return 3
'''


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of the user's, importable here and in the worker processes."""
    (tmp_path / "validate_user_net.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "validate_user_net"


def _validate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return cli(["validate", *argv], capsys)


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """thrifty's exit code on `argv`, and what it wrote (stdout, stderr)."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _check_result(result: dict, batches: list[int], iterations: int) -> None:
    measured, predicted = result["measured"], result["predicted"]
    assert result["batches"] == batches and result["world_size"] == len(batches)
    assert measured["timed_iterations"] == iterations
    assert len(measured["rank_mean_s"]) == len(batches)
    # per iteration the slowest rank's time: at least every rank's own mean
    assert measured["mean_s"] >= max(measured["rank_mean_s"]) > 0
    # each part is the slowest rank's, and the parts of one rank add up to its iteration
    assert measured["forward_s"] + measured["backward_s"] + measured["step_s"] >= measured["mean_s"] - 1e-9
    assert predicted["world_size"] == len(batches)
    assert result["error"] == pytest.approx(predicted["mean_s"] / measured["mean_s"] - 1)
    parts = {row["part"]: row for row in result["parts"]}
    assert list(parts) == PARTS
    assert parts["backward (compute)"]["measured_s"] is None  # not measured apart from the allreduce
    combined = parts["backward + exposed comm."]
    assert combined["measured_s"] == measured["backward_s"]
    assert combined["predicted_s"] == pytest.approx(predicted["backward_s"] + predicted["exposed_comm_s"])
    assert parts["forward (with loss)"]["predicted_s"] == predicted["forward_s"]


def test_a_zoo_model_is_measured_and_predicted_with_its_shipped_profile(tmp_path, capsys):
    out_file = tmp_path / "results" / "mlp.json"
    code, out, err = _validate([MLP, "--config", "local@8+local@16", *QUICK, "--json", "--out", str(out_file)],
                               capsys)
    assert code == 0, err
    document = json.loads(out)
    assert {"format", "factory", "model", "device", "backend", "threads", "iterations", "warmup", "rounds",
            "profile", "allreduce", "configs"} <= set(document)
    assert document["format"] == "thrifty.validation/1"
    assert (document["factory"], document["model"], document["device"], document["backend"]) == \
        (MLP, "mlp", "cpu", "gloo")
    assert document["profile"]["source"] == "shipped"
    assert document["allreduce"] == {"local": "learned"}
    [result] = document["configs"]
    assert result["config"] == "1xlocal@8+1xlocal@16"
    _check_result(result, [8, 16], iterations=3)
    assert json.loads(out_file.read_text()) == document  # the file keeps the same results


def test_the_human_output_shows_each_configuration_and_part(capsys):
    code, out, err = _validate([MLP, "--config", "local@8", "--config", "2xlocal@4", *QUICK], capsys)
    assert code == 0, err
    assert "mlp on 1xlocal@8: 1 rank" in out and "mlp on 2xlocal@4: 2 ranks" in out
    for part in ("iteration mean", "exposed communication", "step (with zero_grad)"):
        assert out.count(part) == 2
    assert "compute profile: shipped" in out
    assert "round 1/1: local@8:" in err and "round 1/1: 2xlocal@4:" in err


def test_a_user_factory_without_a_profile_is_profiled_first(user_module, tmp_path, capsys):
    saved = tmp_path / "tiny__cpu.json"
    code, out, err = _validate([f"{user_module}:tiny", "--config", "local@4+local@8", *QUICK, "--json",
                                "--save-profile", str(saved)], capsys)
    assert code == 0, err
    document = json.loads(out)
    assert document["model"] == "tiny"
    assert document["profile"]["source"] == "measured here"
    assert document["profile"]["path"] == str(saved)
    _check_result(document["configs"][0], [4, 8], iterations=3)
    profile = load_profile(saved)
    assert sorted(p.batch for p in profile.points) == [4, 8]  # the configuration's batches
    assert profile.colocated is not None and profile.colocated.workers == 2  # as two ranks share the host
    assert f"{user_module}:tiny" in profile.provenance.command

    # with that profile given, nothing is profiled again
    code, out, err = _validate([f"{user_module}:tiny", "--config", "local@4", *QUICK, "--profile", str(saved)],
                               capsys)
    assert code == 0, err
    # rich wraps long lines, also inside the path (xdist's tmp_path is longer): compare without whitespace
    assert "".join(f"compute profile: file ({saved})".split()) in "".join(out.split())
    assert "profiling it here first" not in err


@pytest.mark.parametrize("argv, says", [
    (["nocolon", "--config", "local@8"], "must be 'package.module:function'"),
    (["validate_no_such_module:f", "--config", "local@8"], "no module named 'validate_no_such_module'"),
    ([f"{MLP}p", "--config", "local@8"], "has no attribute 'mlpp'"),
    (["USER:raises", "--config", "local@8"], "raised RuntimeError: the data folder is missing"),
    (["USER:not_a_workload", "--config", "local@8"], "returned a value of type int"),
    ([MLP, "--config", "local@8+oops"], "config 'local@8+oops': part 2 'oops' is not COUNTxTYPE@BATCH"),
    ([MLP, "--config", "nosuchtype@8"], "unknown instance type 'nosuchtype'"),
    ([MLP, "--config", "local@0"], "batch is 0, but must be at least 1"),
    ([MLP, "--config", "5000xlocal@8"], "needs 5000 worker processes"),
    ([MLP, "--config", "100000xlocal@8"], "count is 100000, but must be at most 10,000"),
    ([MLP, "--config", "local@8+p3.8xlarge@64"], "has 'p3.8xlarge', but validate runs the configuration"),
    ([MLP, "--config", "local@8", "--iterations", "0"], "--iterations: 0 must be at least 1"),
    ([MLP, "--config", "local@8", "--iterations", "-3"], "--iterations: -3 must be at least 1"),
    ([MLP, "--config", "local@8", "--rounds", "0"], "--rounds: 0 must be at least 1"),
    ([MLP], "the following arguments are required: --config"),
    ([MLP, "--config", "local@8", "--profile", "no-such-profile.json"], "no-such-profile.json: file not found"),
])
def test_bad_input_is_a_clear_message_and_exit_2(argv, says, user_module, capsys):
    argv = [a.replace("USER", user_module) for a in argv]
    code, out, err = _validate([*argv, "--device", "cpu"], capsys)
    assert code == EXIT_BAD_INPUT
    assert says in err
    assert "Traceback" not in err and out == ""


def test_a_raising_factory_from_the_command_line_shows_no_traceback(user_module, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "thrifty.runtime.cli", "validate", f"{user_module}:raises",
                           "--config", "local@8", "--device", "cpu"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == EXIT_BAD_INPUT
    assert proc.stderr.strip() == (f"thrifty validate: error: factory '{user_module}:raises' raised "
                                   "RuntimeError: the data folder is missing")


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


@pytest.mark.skipif(_gpus() == 0, reason="needs a CUDA GPU (validate --device cuda: NCCL, one rank per GPU); "
                                         "runs wherever torch sees one")
def test_on_a_gpu_the_ranks_train_with_nccl(capsys):
    code, out, err = _validate([MLP, "--config", "local@8", "--iterations", "3", "--warmup", "1", "--rounds", "1",
                                "--device", "cuda", "--json"], capsys)
    assert code == 0, err
    document = json.loads(out)
    assert (document["device"], document["backend"]) == ("cuda", "nccl")
    assert document["profile"]["source"] == "measured here"  # no GPU profile of the zoo's MLP ships
    _check_result(document["configs"][0], [8], iterations=3)
