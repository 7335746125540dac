"""HyperSched and POP as Ray Tune schedulers, in a small local Ray Tune run
(2 CPUs, HyperSched's synthetic workload as a function trainable that
checkpoints every step). Skipped when Ray is not installed."""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest

ray = pytest.importorskip("ray", reason="Ray Tune is not installed; `pip install 'thrifty[ray]'` runs these tests")
tune = pytest.importorskip("ray.tune", reason="Ray Tune is not installed; `pip install 'thrifty[ray]'` runs these")

from thrifty.core.errors import ProblemError  # noqa: E402
from thrifty.runtime.tuning import TrialState, synthetic_score  # noqa: E402
from thrifty.runtime.tuning.schedulers.ray_tune import HyperSchedScheduler, POPScheduler, TuneScheduler  # noqa: E402


@pytest.fixture(scope="module")
def local_ray():
    # Ray's workers import the trainable from this module by name
    path = os.pathsep.join(p for p in (os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")) if p)
    # address="local": always a fresh one-node Ray, never one a stale /tmp/ray/ray_current_cluster points to
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


def synthetic_trainable(config):
    """HyperSched 6's Score(k); one step takes step_s / atoms seconds (LINEAR
    scaling on the CPUs Ray gives the trial); a checkpoint at every step."""
    checkpoint = tune.get_checkpoint()
    step = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            with open(os.path.join(folder, "state.json")) as f:
                step = json.load(f)["step"]
    atoms = tune.get_context().get_trial_resources().required_resources.get("CPU", 1)
    if checkpoint is None and "together" in config:
        start_together(config["together"], tune.get_context().get_trial_id())
    while True:
        time.sleep(config["step_s"] / atoms)
        step += 1
        b = config["b"]
        score = synthetic_score(step, b["b0"], b["b1"], b["b2"])
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            tune.report({"score": score, "step": step, "atoms": atoms},
                        checkpoint=tune.Checkpoint.from_directory(folder))


def start_together(together, trial_id, patience_s=300.0):
    """Wait until `together["trials"]` trials have started (each leaves a file in
    `together["folder"]`): on a loaded host Ray started one trial's actor 3 s
    after the other's, long enough for the first to run every iteration alone."""
    folder = together["folder"]
    with open(os.path.join(folder, trial_id), "w"):
        pass
    waited = time.monotonic() + patience_s
    while len(os.listdir(folder)) < together["trials"] and time.monotonic() < waited:
        time.sleep(0.05)


def run(scheduler, configs, tmp_path, step_s=0.05, together=False):
    """One Ray Tune experiment: each configuration of `configs` once, one CPU per atom;
    `together`: the trials take their first step only once all have started."""
    space = {"step_s": step_s, "b": tune.grid_search(configs)}
    if together:
        (tmp_path / "started").mkdir()
        space["together"] = {"folder": str(tmp_path / "started"), "trials": len(configs)}
    tuner = tune.Tuner(
        tune.with_resources(synthetic_trainable, {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(scheduler=scheduler, reuse_actors=False),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="run", verbose=0),
    )
    return tuner.fit()


GOOD = {"b0": 2.0, "b1": 0.9, "b2": 0.1}
MEDIUM = {"b0": 0.5, "b1": 0.5, "b2": 0.5}
POOR = {"b0": 0.01, "b1": 0.0, "b2": 0.9}


def test_hypersched_runs_in_ray_tune(local_ray, tmp_path):
    # the paper's rules verbatim (use_idle_atoms=False): the paused trial stays paused at the end. The deadline
    # is far: the resize below needs T_o < T_n / 2 (4.3's gain test), and on a loaded 2-core host Ray took 41 s
    # to start a trial's actor (T_o), so with 60 s the gain test rightly refused the resize
    scheduler = HyperSchedScheduler(metric="score", mode="max", total_atoms=2, max_iterations=12, deadline_s=600,
                                    min_iterations=1, eta=2, cooldown=1, use_idle_atoms=False)
    results = run(scheduler, [GOOD, POOR], tmp_path, step_s=0.15, together=True)
    assert not results.errors
    ours = scheduler.trials
    assert len(ours) == 2 and scheduler.ended == "exhausted"
    good = next(t for t in ours if t.config["b"] == GOOD)
    poor = next(t for t in ours if t.config["b"] == POOR)
    assert good.state == TrialState.COMPLETED and good.iteration == 12
    # speculative evaluation paused the poor trial (at its first result after the good one reached
    # the first rung); it stayed paused until Ray ended it with the experiment
    assert poor.iteration < good.iteration and poor.state == TrialState.TERMINATED and poor.launches == 1
    # then the good trial ran alone and grew to both atoms (HyperSched 4.3): Ray paused it,
    # gave it two CPUs and it resumed from its checkpoint
    assert good.resizes == 1 and good.launches == 2 and good.iteration_atoms[0] == 1
    assert good.iteration_atoms[-1] == 2
    for result in results:
        mine = next(t for t in ours if t.config == result.config)
        assert result.metrics["step"] == mine.iteration  # resumed, not restarted
    assert results.get_best_result(metric="score", mode="max").metrics["atoms"] == 2
    # measured start-up overheads reached the scheduler
    assert len(good.overheads_s) == 2 and all(o > 0 for o in good.overheads_s)
    assert scheduler.scheduler.overhead_s() > 0


def test_pop_runs_in_ray_tune(local_ray, tmp_path):
    # 20 iterations of 0.05 s: time never binds here (the decisions are the curves'), also when a loaded host
    # makes Ray's per-iteration overhead 10 times longer (with 60 s and 30 s the good trial was terminated)
    scheduler = POPScheduler(0.45, metric="score", mode="max", total_atoms=2, max_iterations=20, deadline_s=600,
                             boundary=2, kill_threshold=0.1, max_time=300.0)
    results = run(scheduler, [POOR, GOOD, MEDIUM], tmp_path)
    assert not results.errors
    ours = scheduler.trials
    poor = next(t for t in ours if t.config["b"] == POOR)
    # poor by domain knowledge: below the kill threshold at the first evaluation boundary
    assert poor.state == TrialState.TERMINATED and poor.iteration == 2
    assert "kill threshold" in scheduler.scheduler.killed[poor.trial_id]
    # the good trial is promising (its predicted curve reaches the target) and runs to the end;
    # the medium one is terminated once its confidence falls below p = 0.05
    good = next(t for t in ours if t.config["b"] == GOOD)
    assert good.state == TrialState.COMPLETED and good.iteration == 20 and good.last_metric >= 0.45
    medium = next(t for t in ours if t.config["b"] == MEDIUM)
    assert medium.state == TrialState.TERMINATED and "confidence" in scheduler.scheduler.killed[medium.trial_id]
    assert scheduler.ended == "exhausted"


def test_bad_settings_are_named():
    from thrifty.runtime.tuning import ASHA

    with pytest.raises(ProblemError, match="mode"):
        TuneScheduler(ASHA(), metric="score", mode="maximum", max_iterations=5)
    with pytest.raises(ProblemError, match="max_iterations"):
        TuneScheduler(ASHA(), metric="score", mode="max", max_iterations=0)
    with pytest.raises(ProblemError, match="scheduler"):
        TuneScheduler("asha", metric="score", mode="max", max_iterations=5)
    with pytest.raises(ProblemError, match="mode"):
        POPScheduler(0.9, metric="score", max_iterations=5)
    with pytest.raises(ProblemError, match="resources_per_atom"):
        TuneScheduler(ASHA(), metric="score", mode="max", max_iterations=5, resources_per_atom={"CPU": 0})


def test_pop_for_ray_tune_takes_the_metric_range_in_the_metric_s_units():
    loss = POPScheduler(0.3, metric="loss", mode="min", max_iterations=5, deadline_s=60)
    assert loss.scheduler.target == -0.3 and loss.scheduler.metric_range == (None, 0.0)  # -loss <= 0
    reward = POPScheduler(150.0, metric="reward", mode="max", max_iterations=5, deadline_s=60,
                          metric_range=(-200.0, None))
    assert reward.scheduler.metric_range == (-200.0, None)
    with pytest.raises(ProblemError, match="target"):
        POPScheduler(150.0, metric="reward", mode="max", max_iterations=5, deadline_s=60)  # beyond [0, 1]
