"""`thrifty tune` with a loop function as the trials' job (issue 35, "tuning
uses the same contract"): the trial's configuration goes to the loop as
keyword arguments, its global batch is the configuration's ``batch_size``
(else the loop's default), its iteration is one epoch of its data (else
``steps_per_iteration``), and it reports the experiment's metric by name, in
the experiment's mode. The loop is the tuning runtime's example
(``example_loop``: `example_trainer` written as a loop function, a few
milliseconds an iteration); the bad loops are written to `tmp_path`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from thrifty.runtime.cli import main
from thrifty.runtime.tuning.record import read_events

pytest.importorskip("torch")

LOOP = "thrifty.runtime.tuning.executors.worlds:example_loop"


def write(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(spec))
    return path


def loop_experiment(**changes) -> dict:
    spec = {"name": "loop", "trainer": LOOP, "search_space": {"lr": {"loguniform": [0.01, 0.5]}},
            "trainer_args": {"samples": 256}, "samples": 3, "seed": 1, "max_iterations": 3,
            "metric": "accuracy", "mode": "max", "scheduler": {"name": "hypersched", "min_iterations": 1, "eta": 2},
            "deadline_s": 120, "resources": {"atoms": 2}, "iteration_timeout_s": 60}
    spec.update(changes)
    return spec


def tuned(tmp_path: Path, spec: dict) -> tuple[int, Path, dict]:
    """Run `spec` with the command line's main, in process: its exit code, results folder and summary."""
    out = tmp_path / "out"
    code = main(["tune", str(write(tmp_path, spec)), "--out", str(out), "--no-progress"])
    return code, out, json.loads((out / "summary.json").read_text())


def checkpoints(out: Path) -> dict[int, dict]:
    """Each trial's last checkpoint (the default storage: the results folder's trials/)."""
    from thrifty.runtime.ddp.checkpoint import load_checkpoint

    found = {}
    for path in sorted((out / "trials").glob("trial-*/checkpoint.pt")):
        found[int(path.parent.name.split("-")[1])] = load_checkpoint(str(path))
    return found


def test_hypersched_tunes_a_loop_function_on_its_configured_batch_an_epoch_an_iteration(tmp_path):
    spec = loop_experiment(search_space={"lr": {"loguniform": [0.01, 0.5]}, "batch_size": {"choice": [32, 64]}})
    code, out, summary = tuned(tmp_path, spec)
    assert code == 0 and summary["best"]["trial"] is not None and summary["finished"] is True
    assert json.loads((out / "best" / "config.json").read_text()) == summary["best"]["config"]
    assert (out / "tuning.png").stat().st_size > 10_000
    events = read_events(out / "events.jsonl")
    results = [e for e in events if e["event"] == "result"]
    assert results and all(0.0 <= e["metric"] <= 1.0 for e in results)  # accuracies, as the loop reported them
    assert summary["best"]["metric"] == max(e["metric"] for e in results) > 0.5  # it learns (chance: 0.25)
    assert summary["end_reason"] in ("exhausted", "target")
    configs = {e["trial"]: e["config"] for e in events if e["event"] == "launch" and "config" in e}
    saved = checkpoints(out)
    assert saved and set(saved) <= set(configs)
    for trial, state in saved.items():
        batch = configs[trial]["batch_size"]
        # the configuration's batch is the trial's global batch, and an iteration is one epoch of 256 samples
        assert state["global_batch"] == batch and state["trainer_args"] == configs[trial]
        assert state["step"] == state["iteration"] * math.ceil(256 / batch) and state["iteration"] >= 1
        assert set(state["state_keys"]) == {"model", "optimizer", "schedule"}  # the loop's own state
    assert (out / "best" / "checkpoint.pt").stat().st_size > 0


def test_pop_minimises_the_loss_a_loop_reports_by_name(tmp_path):
    # no batch_size in the search space: the loop's default (32); an iteration is 3 batches, as the file says
    spec = loop_experiment(metric="val_loss", mode="min", target=0.05, steps_per_iteration=3, max_iterations=4,
                           scheduler={"name": "pop", "boundary": 2})
    code, out, summary = tuned(tmp_path, spec)
    assert code == 4 and summary["best"]["trial"] is not None  # a loss of 0.05 is out of reach (10% noisy labels)
    results = [e for e in read_events(out / "events.jsonl") if e["event"] == "result"]
    assert results and all(0.0 < e["metric"] < 3.0 for e in results)  # validation losses, in their own units
    # the best trial is the one with the lowest loss (mode: min; the scheduler saw -loss)
    assert summary["best"]["metric"] == min(e["metric"] for e in results)
    best_curve = [e["metric"] for e in results if e["trial"] == summary["best"]["trial"]]
    assert best_curve[-1] < best_curve[0]  # its loss fell
    trials = summary["per_trial"]
    assert len(trials) == 3 and not any(t["error"] for t in trials), trials
    assert summary["best"]["metric"] == min(t["best"] for t in trials)  # each trial's best is its lowest loss
    for state in checkpoints(out).values():
        assert state["global_batch"] == 32 and state["step"] == 3 * state["iteration"]


BAD_LOOP = '''
def train(ctx, lr=0.1):
    raise AssertionError("never called")


def train_none(ctx, lr=0.1, batch_size=None):
    raise AssertionError("never called")


def train_sized(ctx, lr=0.1, batch_size=16):
    raise AssertionError("never called")
'''


@pytest.mark.parametrize(("trainer", "change", "field"), [
    ("train", {}, "trainer"),  # no batch anywhere
    ("train_none", {}, "trainer"),  # a default that is no batch
    ("train_sized", {"trainer_args": {"batch_size": 0}}, "trainer_args.batch_size"),
    ("train_sized", {"search_space": {"batch_size": 32.5}}, "search_space.batch_size"),
    ("train_sized", {"search_space": {"batch_size": {"uniform": [16, 64]}}}, "search_space.batch_size.uniform"),
    ("train_sized", {"search_space": {"batch_size": {"choice": [32, 0]}}}, "search_space.batch_size.choice"),
    ("train_sized", {"search_space": {"batch_size": {"randint": [0, 8]}}}, "search_space.batch_size.randint"),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_loop_without_a_global_batch_is_refused_before_any_trial(tmp_path, capsys, monkeypatch, trainer, change,
                                                                   field, dry_run):
    (tmp_path / "bad_loops.py").write_text(BAD_LOOP)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = loop_experiment(trainer=f"bad_loops:{trainer}", search_space={"lr": 0.1}, trainer_args={})
    path = write(tmp_path, {**spec, **change})
    out = tmp_path / "out"
    assert main(["tune", str(path), "--dry-run" if dry_run else "--out", *([] if dry_run else [str(out)])]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and f"{field}:" in err and "batch" in err and "Traceback" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("space", [{"lr": 0.1}, {"lr": 0.1, "batch_size": {"choice": [8, 16]}},
                                   {"lr": 0.1, "batch_size": {"randint": [4, 8]}}])
def test_a_loop_with_a_global_batch_passes_the_dry_run(tmp_path, capsys, monkeypatch, space):
    # its context parameter is not an argument the file must give, and a batch is found (its default's, or the
    # search space's)
    (tmp_path / "bad_loops.py").write_text(BAD_LOOP)
    monkeypatch.syspath_prepend(str(tmp_path))
    trainer = "bad_loops:train_sized"
    path = write(tmp_path, loop_experiment(trainer=trainer, search_space=space, trainer_args={}))
    assert main(["tune", str(path), "--dry-run"]) == 0, capsys.readouterr().err


def test_a_loop_that_never_reports_the_metric_fails_its_trials_naming_the_job_and_the_metric(tmp_path, capsys):
    spec = loop_experiment(metric="val_accuracy", samples=1, max_iterations=2, scheduler="fifo",
                           resources={"atoms": 1}, deadline_s=None)
    out = tmp_path / "out"
    assert main(["tune", str(write(tmp_path, spec)), "--out", str(out), "--no-progress"]) == 1
    assert "every trial failed" in capsys.readouterr().err
    [crash] = [e for e in read_events(out / "events.jsonl") if e["event"] == "crash"]
    message = crash["message"]
    assert "\n" not in message and f"job '{LOOP}'" in message and "'val_accuracy'" in message, message
    assert "reported ['accuracy', 'loss', 'val_loss']" in message  # what it did report, at the iteration's end


def counting_loop(ctx, lr: float = 0.1, batch_size: int = 8) -> None:
    """A loop whose metric is how often its callable metrics were computed on this rank, times the rank's
    number plus one: an iteration of `steps_per_iteration` batches computes them once, at its end, on every
    rank."""
    import torch

    model = torch.nn.Linear(2, 1)
    ddp = ctx.prepare_model(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)
    calls = []

    def evaluations() -> dict:
        calls.append(1)
        return {"evaluations": len(calls) * (ctx.rank + 1)}

    data = torch.utils.data.TensorDataset(torch.randn(64, 2), torch.randn(64, 1))
    for inputs, targets in ctx.prepare_loader(data):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(inputs), targets).backward()
        optimizer.step()
        ctx.report(evaluations, checkpoint={"model": model, "optimizer": optimizer})


def test_a_loop_s_callable_metrics_are_computed_only_at_an_iteration_s_end_on_every_rank(tmp_path):
    from thrifty.runtime.tuning import FIFO, ConfigList, run_experiment
    from thrifty.runtime.tuning.executors.worlds import WorldExecutor

    with WorldExecutor("test_tune_loop:counting_loop", tmp_path, start_timeout_s=90, iteration_timeout_s=60,
                       metric="evaluations", mode="min", steps_per_iteration=4) as executor:
        result = run_experiment(FIFO(atoms_per_trial=2), executor, ConfigList([{"lr": 0.1}]), total_atoms=2,
                                max_iterations=3)
    [trial] = result.trials
    assert trial.error is None and trial.iteration_atoms == [2, 2, 2]
    # once per iteration of 4 batches (not once a batch: 4, 8, 12), on both ranks, combined by batch share
    # (4 and 4 of 8: (k + 2k) / 2; rank 0's alone would be k); the scheduler sees a minimised metric negated
    assert trial.metrics == [-1.5, -3.0, -4.5]
