"""Metrics out (`thrifty.runtime.metrics`): the run folder's metrics.jsonl
(always; the training and tuning runs that write it are tested where they
run: tests/test_run_behaviour.py, tests/test_tune_command.py), and the
optional TensorBoard and MLflow sinks, tested when their packages are
installed (the ``tensorboard`` and ``mlflow`` extras) and skipped, saying
so, otherwise. A sink whose package is missing is refused before a run
starts."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from thrifty.core.errors import MissingDependencyError, ProblemError
from thrifty.runtime.cli import main
from thrifty.runtime.metrics import check_kinds, look_at, open_metrics, parse_kinds

EXAMPLE = "thrifty.runtime.tuning.executors.worlds:example_trainer"
ROOT = Path(__file__).resolve().parent.parent


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_jsonl_sink_appends_one_flushed_line_a_write(tmp_path):
    metrics = open_metrics(tmp_path)
    metrics.write(1, {"loss": 0.5, "accuracy": 0.25, "diverged": math.nan, "note": "text", "flag": True},
                  {"trial": "3"})
    # flushed as written: readable before the sink is closed
    assert lines(tmp_path / "metrics.jsonl")[0]["metrics"] == {"loss": 0.5, "accuracy": 0.25, "diverged": None}
    metrics.close()
    again = open_metrics(tmp_path)  # a resumed run goes on with the same file
    again.write(2, {"loss bad/name:ok*": 0.25})
    again.close()
    written = lines(tmp_path / "metrics.jsonl")
    assert [(w["step"], w["tags"]) for w in written] == [(1, {"trial": "3"}), (2, {})]
    assert written[1]["metrics"] == {"loss bad/name:ok_": 0.25}
    assert again.where() == look_at(tmp_path) == [f"metrics: {tmp_path / 'metrics.jsonl'}"]


def test_the_last_step_written_without_tags_carries_over_to_a_resumed_run(tmp_path):
    metrics = open_metrics(tmp_path)
    assert metrics.last_step is None
    metrics.write(7, {"loss": 0.5})
    metrics.write(9, {"score": 1.0}, {"trial": "3"})  # a tagged step is not the run's
    assert metrics.last_step == 7
    metrics.close()
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 12, "metr')  # a line cut short by a kill
    assert open_metrics(tmp_path).last_step == 7  # what a resumed training run does not write again


@pytest.mark.parametrize(("given", "kinds"), [
    (None, ()), ("jsonl", ()), ("mlflow,tensorboard", ("tensorboard", "mlflow")), (["tensorboard"], ("tensorboard",)),
])
def test_the_sinks_named_are_the_optional_ones_in_order(given, kinds):
    assert parse_kinds(given) == kinds


def test_an_unknown_sink_is_bad_input_on_the_command_line(tmp_path, capsys):
    with pytest.raises(ProblemError, match="^metrics: names 'wandb'"):
        parse_kinds("tensorboard,wandb")
    for command in ("run", "tune"):
        with pytest.raises(SystemExit) as exit_:
            main([command, str(tmp_path / "x.json"), "--metrics", "wandb"])
        assert exit_.value.code == 2 and "names 'wandb'" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["tensorboard", "mlflow"])
def test_a_sink_whose_package_is_missing_is_refused_before_the_run(tmp_path, monkeypatch, capsys, kind):
    from thrifty.runtime.tuning.driver import tune

    monkeypatch.setitem(sys.modules, kind, None)  # as if not installed: importing it raises ImportError
    with pytest.raises(MissingDependencyError, match=rf"thrifty\[{kind}\]"):
        check_kinds([kind])
    spec = {"trainer": EXAMPLE, "search_space": {"lr": 0.1}, "samples": 1, "max_iterations": 1, "scheduler": "fifo"}
    with pytest.raises(MissingDependencyError):
        tune(spec, out=tmp_path / "out", metrics=[kind])
    assert not (tmp_path / "out").exists()
    # a training run's dry run refuses it too: exit 2, naming the extra
    monkeypatch.chdir(tmp_path)
    problem = str(ROOT / "datasets" / "examples" / "local-demo-srifty54.json")
    assert main(["run", problem, "--trainer", "thrifty.runtime.training.examples:zoo", "--metrics", kind,
                 "--dry-run"]) == 2
    assert f"thrifty[{kind}]" in capsys.readouterr().err and not (tmp_path / "thrifty-runs").exists()


def scalars(folder, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_the_tensorboard_sink_writes_a_run_per_tag_set(tmp_path):
    pytest.importorskip("tensorboard", reason="TensorBoard is not installed (the 'tensorboard' extra)")
    metrics = open_metrics(tmp_path, ["tensorboard"])
    for step in (1, 2):
        metrics.write(step, {"loss": 1.0 / step, "diverged": math.inf}, {"trial": "0"})
        metrics.write(step, {"loss": 2.0 / step})
    metrics.close()
    assert scalars(tmp_path / "tensorboard" / "trial-0", "loss") == [(1, 1.0), (2, 0.5)]
    assert scalars(tmp_path / "tensorboard", "loss") == [(1, 2.0), (2, 1.0)]
    assert metrics.where()[1] == f"TensorBoard: tensorboard --logdir {tmp_path / 'tensorboard'}"


def mlflow_runs(folder, experiment: str) -> dict[str, dict]:
    """Each MLflow run of `experiment` in the file store under `folder`: its tags and its loss history."""
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri=(folder / "mlruns").resolve().as_uri())
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id])
    return {r.info.run_name: {"tags": {k: v for k, v in r.data.tags.items() if k.startswith("thrifty.")},
                              "status": r.info.status,
                              "history": {key: [(m.step, m.value) for m in client.get_metric_history(r.info.run_id,
                                                                                                      key)]
                                          for key in r.data.metrics}} for r in runs}


def test_the_mlflow_sink_writes_a_run_per_tag_set_to_the_file_store_and_goes_on_with_it(tmp_path):
    pytest.importorskip("mlflow", reason="MLflow is not installed (the 'mlflow' extra)")
    metrics = open_metrics(tmp_path, ["mlflow"], name="exp")
    metrics.write(1, {"loss": 1.0, "diverged": math.nan}, {"trial": "0"})
    metrics.write(1, {"loss": 3.0}, {"trial": "1"})
    metrics.close()
    resumed = open_metrics(tmp_path, ["mlflow"], name="exp")  # a resumed run: the same MLflow runs go on
    resumed.write(2, {"loss": 0.5}, {"trial": "0"})
    resumed.close()
    runs = mlflow_runs(tmp_path, "exp")
    assert runs == {"trial-0": {"tags": {"thrifty.trial": "0"}, "status": "FINISHED",
                                "history": {"loss": [(1, 1.0), (2, 0.5)]}},
                    "trial-1": {"tags": {"thrifty.trial": "1"}, "status": "FINISHED",
                                "history": {"loss": [(1, 3.0)]}}}
    assert resumed.where()[1].startswith("MLflow: mlflow ui --backend-store-uri file://")


def test_a_tuning_run_sends_each_result_to_tensorboard_and_mlflow(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="TensorBoard is not installed (the 'tensorboard' extra)")
    pytest.importorskip("mlflow", reason="MLflow is not installed (the 'mlflow' extra)")
    pytest.importorskip("torch")
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps({"name": "sinks", "trainer": EXAMPLE, "search_space": {"lr": {"choice": [0.1, 0.3]}},
                                "samples": 2, "max_iterations": 2, "scheduler": "fifo", "resources": {"atoms": 1},
                                "iteration_timeout_s": 60}))
    out = tmp_path / "out"
    assert main(["tune", str(path), "--out", str(out), "--metrics", "tensorboard,mlflow", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"TensorBoard: tensorboard --logdir {out / 'tensorboard'}" in printed and "MLflow: mlflow ui" in printed
    results = [e for e in lines(out / "events.jsonl") if e["event"] == "result"]
    runs = mlflow_runs(out, "out")
    for trial in (0, 1):
        curve = [(e["iteration"], e["metric"]) for e in results if e["trial"] == trial]
        assert len(curve) == 2
        assert scalars(out / "tensorboard" / f"trial-{trial}", "accuracy") == pytest.approx(curve)  # float32
        assert runs[f"trial-{trial}"]["history"]["accuracy"] == curve
