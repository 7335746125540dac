"""The user-loop example (`datasets/examples/cnn/train.py`), named by its file
as a user names it, through every command with no glue: `thrifty profile`
times it, `thrifty solve` prices a problem naming it (``"job"``, read from the
problem file's folder) with that profile, and a run of the problem re-planned
after a preemption trains, on unequal batches split in unequal micro-batches,
what one process trains (to 1e-6, in fp32); `thrifty validate` measures it and
`thrifty tune` tunes it (HyperSched, and POP on ``mode: min``). Also: a job file or function that
is not there is one line and exit 2, the batch check lets micro-batches through
that add up to the rank's batch (and no other batch), and the loader says where
an epoch ends. Tiny images, worlds of 1-3 ranks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from thrifty.core.errors import ProblemError  # noqa: E402
from thrifty.runtime.cli import main  # noqa: E402
from thrifty.runtime.training import KillWorker, RunConfig, train  # noqa: E402

from test_job_loop import ONE, checkpoint  # noqa: E402
from test_training_runtime_processes import FAST, HETEROGENEOUS, max_difference, no_leftover_workers  # noqa: E402,F401
from test_training_runtime_units import demo_problem, plan_dict  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "datasets" / "examples" / "cnn" / "train.py"
JOB = "datasets/examples/cnn/train.py:train"  # from the repository's root, as a user types it
# fp32 (no autocast) for an exact comparison; 40 samples: the global batch of 16 ends an epoch mid-batch
TINY = {"precision": "fp32", "samples": 40, "held_out": 16, "size": 8, "channels": 2, "width": 4, "classes": 3}
CHECKPOINTS = RunConfig(**{**FAST.__dict__, "checkpoint_every": 5})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("THRIFTY_PROFILE_CACHE", str(tmp_path / "profiles"))
    monkeypatch.chdir(ROOT)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_the_example_profiled_validated_solved_replanned_and_tuned_with_no_glue(tmp_path, cache, capsys):
    """The one loop through every command: profile, validate, solve (its
    problem names the job), run (re-planned after a preemption: what one
    process trains, to 1e-6), and tune (HyperSched on its accuracy, POP on
    ``mode: min`` on its loss)."""
    assert main(["profile", JOB, "--job-args", json.dumps(TINY), "--batches", "4,8,16", "--repeats", "2",
                 "--warmup", "1", "--rounds", "1", "--no-progress"]) == 0
    capsys.readouterr()
    # validate: its own loop in DDP on unequal batches, predicted from the profile just cached
    assert main(["validate", JOB, "--job-args", json.dumps(TINY), "--config", "local@4+local@8", "--iterations",
                 "3", "--warmup", "1", "--rounds", "1", "--device", "cpu", "--json"]) == 0
    validated = json.loads(capsys.readouterr().out)
    assert validated["kind"] == "job" and validated["profile"]["source"] == "job profile cache"
    (config,) = validated["configs"]
    assert config["batches"] == [4, 8] and config["measured"]["mean_s"] > 0 and config["predicted"]["mean_s"] > 0
    problem = tmp_path / "problems" / "cnn.json"  # its job is read from its own folder, whatever the current one
    problem.parent.mkdir()
    problem.write_text(json.dumps(demo_problem(iterations=20, limits={"time_s": 3600}, job_args=TINY,
                                               job=f"{os.path.relpath(EXAMPLE, problem.parent)}:train")))
    capsys.readouterr()
    assert main(["solve", str(problem), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["status"] == "optimal"
    assert {p["compute"]["kind"] for p in plan["provenance"].values()} == {"measured"}  # the job's own profile

    # no job given: the problem's; 3 + 5 + 8 samples, each rank's in 2 micro-batches (3 = 2 + 1, 5 = 3 + 2)
    single = train(ONE, problem=problem, run_dir=tmp_path / "single", config=CHECKPOINTS)
    result = train(plan_dict(*HETEROGENEOUS), problem=problem, run_dir=tmp_path / "run", config=CHECKPOINTS,
                   faults=[KillWorker(0, at_iteration=12)])
    lost, after = result.segments
    assert (lost.ended, lost.committed_iteration) == ("lost", 10) and after.start_iteration == 10
    assert len(result.replans) == 1
    final, reference = checkpoint(result.checkpoint_path), checkpoint(single.checkpoint_path)
    assert final["trainer"] == f"{EXAMPLE}:train" and final["trainer_args"] == TINY
    assert final["step"] == reference["step"] == 20 and final["schedule"] == reference["schedule"]
    assert final["schedule"]["last_epoch"] == 20  # the OneCycle schedule went on from the checkpoint at 10
    assert max_difference(final["model"], reference["model"]) < 1e-6
    assert max_difference(final["model"], checkpoint(tmp_path / "run" / "checkpoint.pt")["model"]) == 0

    # tune: the same file as the trials' job (read from the experiment's folder), the configuration as its
    # arguments, a trial's iteration one epoch of its data (where the loop evaluates), its metric by name
    experiment = {"name": "cnn", "trainer": f"{os.path.relpath(EXAMPLE, problem.parent)}:train",
                  "trainer_args": {**TINY, "schedule_iterations": 40},
                  "search_space": {"lr": {"loguniform": [0.01, 0.2]}, "batch_size": {"choice": [8, 16]}},
                  "samples": 3, "seed": 0, "max_iterations": 3, "metric": "val_accuracy", "mode": "max",
                  "scheduler": {"name": "hypersched", "min_iterations": 1, "eta": 2}, "deadline_s": 120,
                  "resources": {"atoms": 2}, "iteration_timeout_s": 60}
    for scheduler, metric, mode in (("hypersched", "val_accuracy", "max"), ("pop", "val_loss", "min")):
        spec = problem.parent / f"tune-{scheduler}.json"
        pop = {"scheduler": {"name": "pop", "boundary": 2}, "target": 0.01} if scheduler == "pop" else {}
        spec.write_text(json.dumps({**experiment, "metric": metric, "mode": mode, **pop}))
        out = tmp_path / f"tuned-{scheduler}"
        assert main(["tune", str(spec), "--out", str(out), "--no-progress"]) in (0, 4)  # 4: the deadline ended it
        summary = json.loads((out / "summary.json").read_text())
        trials = summary["per_trial"]
        assert summary["best"]["trial"] is not None and not any(t["error"] for t in trials), trials
        pick = min if mode == "min" else max
        assert summary["best"]["metric"] == pick(t["best"] for t in trials)  # in the metric's own units and mode
        assert (0.0 <= summary["best"]["metric"] <= 1.0) if metric == "val_accuracy" else summary["best"]["metric"] > 0


def test_a_job_file_or_function_that_is_not_there_is_one_line_and_exit_2(tmp_path, cache, capsys):
    problem = tmp_path / "problem.json"
    problem.write_text(json.dumps(demo_problem(iterations=20, limits={"time_s": 3600})))
    assert main(["run", str(problem), "--job", "jobs/missing.py:train", "--out", str(tmp_path / "r"),
                 "--dry-run"]) == 2
    assert f"there is no file '{ROOT / 'jobs' / 'missing.py'}'" in one_line_error(capsys)  # from the current folder
    assert main(["profile", "datasets/examples/cnn/train.py:trian", "--batches", "4,8"]) == 2
    assert "has no attribute 'trian'; did you mean 'train'?" in one_line_error(capsys)
    assert main(["profile", str(problem)]) == 2  # a problem file in place of the job must name one
    assert "names no job" in one_line_error(capsys)
    problem.write_text(json.dumps(demo_problem(job=f"{EXAMPLE}:train", job_args=TINY)))
    assert main(["profile", str(problem), "--job-args", "{}"]) == 2
    assert "gives the job's arguments (job_args); leave --job-args out" in one_line_error(capsys)
    problem.write_text(json.dumps(demo_problem(job="missing.py:train")))
    assert main(["solve", str(problem)]) == 2
    err = one_line_error(capsys)
    assert "job" in err and f"file not found: {tmp_path / 'missing.py'}" in err  # read from the problem's folder


def test_a_job_file_is_imported_once_by_its_path_and_named_by_its_absolute_path(cache):
    from thrifty.runtime.ddp.trainer import resolve_job, trainer_spec

    code = resolve_job(JOB, TINY)
    assert code.loop is not None and code.loop is resolve_job(str(EXAMPLE) + ":train").loop
    assert trainer_spec(JOB) == trainer_spec(code.loop) == f"{EXAMPLE}:train"
    assert trainer_spec("thrifty.runtime.training.examples:zoo") == "thrifty.runtime.training.examples:zoo"


# -- the context's side, in this process ----------------------------------------------

def _context(tmp_path, batches, rank):
    from thrifty.runtime.ddp.context import JobContext
    from thrifty.runtime.ddp.job import JobSpec
    from thrifty.runtime.worlds import RankChannel

    job = JobSpec(trainer="m:f", global_batch=sum(batches), iterations=6, batches=tuple(batches), seed=1,
                  checkpoint_path=str(tmp_path / "c.pt"), restore="never")
    return JobContext(job, RankChannel(None, rank, len(batches)), torch.device("cpu"), False, sum(batches), batches)


def test_the_loader_says_when_the_batch_just_drawn_ends_an_epoch(tmp_path):
    data = torch.utils.data.TensorDataset(torch.arange(20.0))
    ends = []
    for rank in (0, 1):
        ctx = _context(tmp_path, [5, 3], rank)  # a global batch of 8 over 20 samples
        loader = ctx.prepare_loader(data)
        assert not loader.epoch_end
        ends.append([loader.epoch_end for _ in loader])
    # an epoch is ceil(20 / 8) = 3 batches, as a DataLoader counts them (and a tuning trial's iteration)
    assert ends[0] == ends[1] == [False, False, True, False, False, True]
    assert loader.batches_per_epoch == 3


def test_an_experiments_trainer_in_a_file_is_read_from_the_experiments_folder(tmp_path, cache):
    from thrifty.runtime.tuning.experiment_file import load_experiment, resolve_trainer

    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "mine.py").write_text("def factory(learning_rate=0.1):\n    pass\n")
    experiment = json.loads((ROOT / "datasets" / "examples" / "tune-digits.json").read_text())
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps({**experiment, "trainer": "jobs/mine.py:factory",
                                "search_space": {"learning_rate": {"loguniform": [0.001, 0.1]}}}))
    loaded = load_experiment(path)
    assert loaded.trainer == f"{tmp_path / 'jobs' / 'mine.py'}:factory"
    resolve_trainer(loaded)  # imports the file, checks the search space against the factory's arguments
    path.write_text(json.dumps({**experiment, "trainer": "jobs/mine.py:factory"}))
    with pytest.raises(ProblemError, match="takes no argument 'optimizer'"):
        resolve_trainer(load_experiment(path))


def test_a_profiled_iteration_of_micro_batches_counts_each_ones_backward_as_backward():
    from thrifty.runtime.measure.job_profile import _Iteration, _split

    # forward 0-1, backward 1-3, forward 3-4, backward 4-6 (its last gradient at 6), step 6-7
    two = _Iteration(start=0.0, forwards=[(0.0, 1.0), (3.0, 4.0)], ready={"w": 5.5, "b": 6.0}, end=7.0)
    assert _split(two) == (2.0, 4.0, 1.0)
    one = _Iteration(start=0.0, forwards=[(0.5, 1.5)], ready={"w": 3.0, "b": 4.0}, end=5.0)
    assert _split(one) == (1.0, 2.5, 1.5)  # one pass: from its end to the last gradient, as before
