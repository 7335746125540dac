"""The job contract's loop functions (`thrifty.runtime.ddp.context`), run by
the real worker processes (gloo on 127.0.0.1): a user loop with a learning-rate
schedule re-planned after a preemption trains what one process trains, and
bad loops fail with one line naming the job and the rank's log, keeping their
checkpoint. Tiny float64 MLP, worlds of 1-3 ranks."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from thrifty.runtime.training import KillWorker, RunConfig, WorkerFailed, train  # noqa: E402

from test_training_runtime_processes import FAST, HETEROGENEOUS, max_difference, no_leftover_workers  # noqa: E402,F401
from test_training_runtime_units import demo_problem, plan_dict  # noqa: E402

LOOP = "thrifty.runtime.training.examples:mlp_loop"
VALIDATED = "test_job_loop:mlp_loop_validated_every_4"  # LOOP with a val_loss every 4th iteration
ONE = plan_dict(("local-b", "on_demand", 1, 16))
TWO = plan_dict(("local-a", "spot", 1, 6), ("local-b", "spot", 1, 10))
CHECKPOINTS = RunConfig(**{**FAST.__dict__, "checkpoint_every": 5})


def checkpoint(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


class _ValidatedEvery:
    """A context whose reports carry ``val_loss`` (= iteration / 100) every `k`-th iteration, as a loop's
    evaluation at its epoch ends would."""

    def __init__(self, ctx, k):
        self._ctx, self._k = ctx, k

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def report(self, metrics, checkpoint=None):
        i = self._ctx.iteration
        self._ctx.report({**metrics, **({"val_loss": i / 100} if i % self._k == 0 else {})}, checkpoint=checkpoint)


def mlp_loop_validated_every_4(ctx):
    from thrifty.runtime.training.examples import mlp_loop

    mlp_loop(_ValidatedEvery(ctx, 4))


def metrics_written(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_user_loop_replanned_after_a_preemption_trains_what_one_process_trains(tmp_path):
    single = train(ONE, VALIDATED, problem=demo_problem(iterations=40), run_dir=tmp_path / "single", config=FAST)
    result = train(plan_dict(*HETEROGENEOUS), VALIDATED, problem=demo_problem(iterations=40), run_dir=tmp_path / "run",
                   config=FAST, faults=[KillWorker(0, at_iteration=15)])
    lost, after = result.segments
    assert (lost.ended, lost.committed_iteration) == ("lost", 10) and after.start_iteration == 10
    assert after.batches != (3, 5, 8) and len(result.replans) == 1
    final, reference = checkpoint(result.checkpoint_path), checkpoint(single.checkpoint_path)
    # the schedule, the optimizer and the data position went on from the checkpoint at 10 (a schedule that
    # restarted at the re-plan would stand at 30)
    assert final["step"] == reference["step"] == 40 and final["schedule"]["last_epoch"] == 40
    assert final["schedule"] == reference["schedule"]
    assert max_difference(final["model"], reference["model"]) < 1e-6
    momentum = {k: v["momentum_buffer"] for k, v in final["optimizer"]["state"].items()}
    assert max((momentum[k] - v["momentum_buffer"]).abs().max().item()
               for k, v in reference["optimizer"]["state"].items()) < 1e-6
    # every record reaches metrics.jsonl once, in order: the lost world's up to its end (past its checkpoint at
    # 10), the new world's after those (its replays of 11.. are dropped), the val_loss of every 4th iteration too
    for run in (single, result):
        written = metrics_written(run.run_dir)
        assert [w["step"] for w in written] == list(range(1, 41))
        assert all(w["metrics"]["loss"] > 0 and 0 <= w["metrics"]["accuracy"] <= 1 for w in written)
        assert [(w["step"], w["metrics"]["val_loss"]) for w in written if "val_loss" in w["metrics"]] == \
            [(i, i / 100) for i in range(4, 41, 4)]


# -- bad loops ------------------------------------------------------------------------

def _setup(ctx):
    from thrifty.runtime.training.examples import _mlp, _teacher_data

    model = _mlp(8, 16, 4, torch.float64, 0)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), _teacher_data(8, 4, 240, torch.float64, 0)


def _step(model, optimizer, inputs, targets):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss


def loop_without_prepare_model(ctx):
    model, optimizer, data = _setup(ctx)
    for inputs, targets in ctx.prepare_loader(data):
        ctx.report({"loss": _step(model, optimizer, inputs, targets).item()}, checkpoint={"model": model})


def loop_that_never_reports(ctx):
    model, optimizer, data = _setup(ctx)
    model = ctx.prepare_model(model)
    for inputs, targets in ctx.prepare_loader(data):
        _step(model, optimizer, inputs, targets)


def loop_that_reports_nan(ctx):
    model, optimizer, data = _setup(ctx)
    model = ctx.prepare_model(model)
    for inputs, targets in ctx.prepare_loader(data):
        loss = _step(model, optimizer, inputs, targets).item()
        ctx.report({"loss": math.nan if ctx.iteration == 7 else loss}, checkpoint={"model": model})


def loop_that_raises(ctx):
    model, optimizer, data = _setup(ctx)
    model = ctx.prepare_model(model)
    for inputs, targets in ctx.prepare_loader(data):
        _step(model, optimizer, inputs, targets)
        if ctx.iteration == 7 and ctx.rank == 1:
            raise KeyError("no such column")
        ctx.report(checkpoint={"model": model, "optimizer": optimizer})


def loop_that_changes_its_batch(ctx):
    model, optimizer, data = _setup(ctx)
    model = ctx.prepare_model(model)
    for inputs, targets in ctx.prepare_loader(data):
        if ctx.iteration == 7:
            inputs, targets = data.tensors[0][:7], data.tensors[1][:7]
        ctx.report({"loss": _step(model, optimizer, inputs, targets).item()}, checkpoint={"model": model})


def loop_that_stops_early(ctx):
    model, optimizer, data = _setup(ctx)
    model = ctx.prepare_model(model)
    for inputs, targets in ctx.prepare_loader(data):
        ctx.report({"loss": _step(model, optimizer, inputs, targets).item()}, checkpoint={"model": model})
        if ctx.iteration == 7:
            return


@pytest.mark.parametrize("loop, plan, message, kept", [
    ("loop_without_prepare_model", ONE, r"reported without calling ctx\.prepare_model\(model\)", None),
    ("loop_that_never_reports", ONE, r"returned without calling ctx\.report\(\)", None),
    ("loop_that_reports_nan", TWO, r"reported loss = nan at iteration 7; the checkpoint of iteration 5 is kept", 5),
    ("loop_that_raises", TWO, r"\(rank 1\) raised KeyError: 'no such column'", 5),
    ("loop_that_changes_its_batch", TWO, r"trained on a batch of shape \(7, 8\), but the plan gives this rank \d+ "
                                         r"samples", 5),
    ("loop_that_stops_early", ONE, r"returned after iteration 7 of 12", 5),
])
def test_a_bad_loop_fails_with_one_line_naming_the_job_and_the_log_and_keeps_its_checkpoint(tmp_path, loop, plan,
                                                                                          message, kept):
    spec = f"test_job_loop:{loop}"
    with pytest.raises(WorkerFailed) as failed:
        train(plan, spec, problem=demo_problem(iterations=12), run_dir=tmp_path, config=CHECKPOINTS)
    text = str(failed.value)
    assert "\n" not in text
    assert f"job '{spec}'" in text and f"(log: {tmp_path}" in text, text
    assert __import__("re").search(message, text), text
    saved = tmp_path / "checkpoint.pt"
    assert (checkpoint(saved)["iteration"] if saved.exists() else None) == kept
    if kept is not None:  # a failed run keeps the records it sent, at least those up to its checkpoint
        steps = [w["step"] for w in metrics_written(tmp_path)]
        assert steps[:kept] == list(range(1, kept + 1)) and steps == sorted(set(steps)), steps


def test_run_takes_a_loop_function_as_its_job_and_checks_its_arguments_before_starting(tmp_path, capsys):
    import json

    from thrifty.runtime.cli import main

    problem = tmp_path / "problem.json"
    problem.write_text(json.dumps(demo_problem(iterations=20, limits={"time_s": 3600})))
    base = ["run", str(problem), "--job", LOOP, "--run-dir", str(tmp_path / "run"), "--dry-run"]
    assert main(base) == 0
    capsys.readouterr()
    assert main([*base, "--job-args", '{"learning_rate": 0.1}']) == 2
    err = capsys.readouterr().err
    assert f"job '{LOOP}' cannot take the arguments" in err and "learning_rate" in err


# -- the loader, in this process -------------------------------------------------------

class Squares(torch.utils.data.Dataset):
    """A map-style dataset with a transform: sample i is (i, i*i) as dict fields."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return {"x": torch.tensor([float(i)]), "y": i * i}


def collate_with_tag(samples):
    batch = torch.utils.data.default_collate(samples)
    return {**batch, "tag": "mine"}


@pytest.mark.parametrize("workers", [0, 1])
def test_prepare_loader_gives_each_rank_its_share_with_the_users_collate_and_workers(tmp_path, workers):
    from thrifty.runtime.ddp.context import JobContext
    from thrifty.runtime.ddp.job import JobSpec
    from thrifty.runtime.ddp.sharding import ShardedStream, rank_offsets
    from thrifty.runtime.worlds import RankChannel

    batches = [3, 5, 8]
    job = JobSpec(trainer="m:f", global_batch=16, iterations=7, batches=tuple(batches), seed=3,
                  checkpoint_path=str(tmp_path / "c.pt"), restore="never")
    user = torch.utils.data.DataLoader(Squares(), batch_size=64, shuffle=True, collate_fn=collate_with_tag,
                                       num_workers=workers)
    for rank, offset in enumerate(rank_offsets(batches)):
        ctx = JobContext(job, RankChannel(None, rank, 3), torch.device("cpu"), False, 16, batches)
        loader = ctx.prepare_loader(user)
        assert len(loader) == 7 and loader.batches_per_epoch == 3
        got = list(loader)
        stream = ShardedStream(40, 16, offset, batches[rank], seed=3)  # 40 samples: epochs end mid-batch
        assert [b["tag"] for b in got] == ["mine"] * 7 and ctx.step == 7 and ctx.iteration == 7
        for step, batch in enumerate(got):
            indices = torch.from_numpy(stream.indices(step)).double()
            assert torch.equal(batch["x"][:, 0], indices) and torch.equal(batch["y"], (indices ** 2).long())


# -- telling a loop function from a Trainer factory --------------------------------------

def factory_with_a_required_argument(hidden):
    from thrifty.runtime.training.examples import tiny_mlp

    return tiny_mlp(hidden=hidden)


def loop_with_an_annotated_context(context: "JobContext", hidden=16):  # noqa: F821 - only its name is read
    pass


def test_a_job_is_a_loop_function_when_its_first_parameter_takes_the_context():
    from thrifty.runtime.ddp.trainer import Trainer, is_loop_function, resolve_job
    from thrifty.runtime.training.examples import mlp_loop, tiny_mlp, zoo

    assert is_loop_function(mlp_loop) and is_loop_function(mlp_loop, {"lr": 0.1})
    assert is_loop_function(loop_with_an_annotated_context, {"context": 1})
    assert not is_loop_function(tiny_mlp) and not is_loop_function(zoo, {"model": "mlp"})
    assert not is_loop_function(factory_with_a_required_argument, {"hidden": 8})
    code = resolve_job("test_job_loop:factory_with_a_required_argument", {"hidden": 8})
    assert code.loop is None and isinstance(code.trainer, Trainer)
    assert resolve_job(LOOP, {"lr": 0.1}).loop is mlp_loop
