"""Scaling profiles measured with real DDP worlds (gloo on 127.0.0.1)."""

from __future__ import annotations

import json
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="the scaling profiler runs torch.distributed; install thrifty[torch]")

from thrifty.core import ProblemError  # noqa: E402
from thrifty.runtime.measure.probe import ProbeFailed  # noqa: E402
from thrifty.perfmodels.scaling import load_scaling_profile  # noqa: E402
from thrifty.runtime.measure.scaling_profiler import check_world_sizes, profile_scaling  # noqa: E402
from thrifty.runtime.cli import main  # noqa: E402

MLP = "thrifty.runtime.measure.zoo:mlp"


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The CLI's profile of the small MLP at 1 and 2 workers, trial batch 8."""
    out = tmp_path_factory.mktemp("scaling") / "mlp__local.json"
    argv = ["profile-scaling", MLP, "--world-sizes", "2,1", "--batch", "8", "--out", str(out),
            "--iterations", "3", "--warmup", "1", "--device", "cpu", "--timeout", "60", "--no-progress"]
    code = main(argv)
    return code, out


def test_cli_writes_a_profile_that_loads(written):
    code, out = written
    assert code == 0
    profile = load_scaling_profile(str(out), "local")
    assert profile.gpus == (1, 2)
    assert profile.model == "mlp" and profile.instance_type == "local" and profile.batch == 8
    assert all(t > 0 for t in profile.iteration_s)
    assert all(sd >= 0 for sd in profile.iteration_sd_s)
    assert profile.startup_s > 0  # spawning interpreters and importing torch takes time


def test_profile_says_how_it_was_measured(written):
    _code, out = written
    document = json.loads(out.read_text())
    assert document["format"] == "thrifty.scaling_profile/1"
    provenance = document["provenance"]
    assert provenance["kind"] == "measured"
    assert provenance["command"].startswith(f"thrifty profile-scaling {MLP} --world-sizes 1,2 --batch 8")
    assert "torch" in provenance["machine"] and "gloo" in provenance["machine"]
    assert [p["repeats"] for p in document["points"]] == [3, 3]


def test_a_failing_world_raises_instead_of_hanging(tmp_path, monkeypatch):
    (tmp_path / "odd_workload.py").write_text(textwrap.dedent("""
        from thrifty.runtime.measure.zoo import mlp

        def batch_of_four_only():
            workload = mlp()
            def make_batch(n):
                if n != 4:
                    raise ValueError(f"this dataset has batches of 4, not {n}")
                return workload.make_batch(n)
            return workload.model, make_batch, workload.loss_fn
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the workers are fresh interpreters
    with pytest.raises(ProbeFailed, match="(?s)rank 0 failed.*batches of 4, not 2"):
        profile_scaling("odd_workload:batch_of_four_only", [1], 2, iterations=1, warmup=0, device="cpu",
                        timeout_s=30)


@pytest.mark.parametrize(
    ("sizes", "batch", "message"),
    [
        ([], 8, "world_sizes is empty"),
        ([0, 1], 8, "world_sizes has 0"),
        ([2, 4], 8, "must include 1"),
        ([1, 3], 8, "batch is 8, but must be divisible by every world size \\(3"),
        ([1], 0, "batch is 0"),
    ],
)
def test_bad_world_sizes_and_batches(sizes, batch, message):
    with pytest.raises(ProblemError, match=message):
        check_world_sizes(sizes, batch)


def test_bad_counts_are_rejected_before_any_process_starts():
    with pytest.raises(ProblemError, match="iterations is 0"):
        profile_scaling(MLP, [1], 8, iterations=0, warmup=0, device="cpu")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--world-sizes", "1,x", "--batch", "8"], "--world-sizes is '1,x'"),
        (["--world-sizes", "0,1", "--batch", "8"], "--world-sizes has 0"),
        (["--world-sizes", "1,3", "--batch", "8"], "--batch is 8"),
        (["--world-sizes", "1,2", "--batch", "8", "--device", "cpu", "--factory-typo"], None),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(tmp_path, capsys, args, named):
    out = tmp_path / "p.json"
    if named is None:  # an unknown option: argparse's usage error, also exit 2
        with pytest.raises(SystemExit) as exited:
            main(["profile-scaling", MLP, *args, "--out", str(out)])
        assert exited.value.code == 2
    else:
        assert main(["profile-scaling", MLP, *args, "--out", str(out), "--no-progress"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and named in lines[0]
    assert not out.exists()


def test_cli_bad_factory_exits_2(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["profile-scaling", "thrifty.runtime.measure.zoo:nope", "--world-sizes", "1", "--batch", "8",
                 "--out", str(out), "--device", "cpu", "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "'nope'" in lines[0]
    assert not out.exists()
