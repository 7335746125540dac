"""Tuning on a Ray cluster: the tuning loop's executor with its trials' ranks
on the machines of a `RayProvider` (`thrifty.runtime.tuning.executors.worlds` given the provider), on
the three-node cluster of the cluster tests (every node on 127.0.0.1; two
local-a spot machines, one slot each). HyperSched runs two trials side by
side, one on each machine, and grows the survivor to a world that spans
both; the RubberBand plan executor runs a two-stage plan whose second stage
gives a machine back; a trial whose job is a loop function (the job
contract), checkpointed to S3 (a moto server on 127.0.0.1, which every node
reaches with the AWS configuration in its own environment), is paused on one
machine and resumed on the other."""

from __future__ import annotations

import uuid

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed; `pip install 'thrifty[ray]'` runs these tests")
pytest.importorskip("torch")

from thrifty.datasets.catalog import load_catalog  # noqa: E402
from thrifty.runtime.cluster.provider import RayProvider  # noqa: E402
from thrifty.runtime.ddp.checkpoint import load_checkpoint  # noqa: E402
from thrifty.runtime.tuning import ConfigList, HyperSched, TrialState, run_experiment  # noqa: E402
from thrifty.runtime.tuning.executors.plan import execute_plan  # noqa: E402
from thrifty.runtime.tuning.executors.worlds import RANK_PRELOAD, WorldExecutor  # noqa: E402
from thrifty.runtime.tuning.trial import Report, Trial  # noqa: E402

from aws_fakes import FAKE_AWS_ENV, moto_server  # noqa: E402
from ray_cluster import ThreeNodes  # noqa: E402
from test_cluster_ray import CATALOG  # noqa: E402
from test_tuning_executors import EXAMPLE, assert_reaped, check_placements  # noqa: E402

LOOP = "thrifty.runtime.tuning.executors.worlds:example_loop"  # EXAMPLE's model and data, as a loop function

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def s3():
    """A moto server for the module, with this process (the driver) pointed at it."""
    with moto_server() as server, pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ENDPOINT_URL_S3", server.url)
        yield server


@pytest.fixture(scope="module")
def nodes(s3):
    """The cluster tests' three nodes, each with the AWS configuration to reach the S3 server in its own
    environment (as an EC2 machine has its instance profile)."""
    cluster = ThreeNodes(env={**FAKE_AWS_ENV, "AWS_ENDPOINT_URL_S3": s3.url})
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def shared_provider(nodes):
    """One provider for the module: its agents and their fork servers, warm, serve every test (as they
    serve one tuning run's trials)."""
    made = RayProvider("tuning-test", load_catalog(CATALOG), nodes.cluster.address, preload=RANK_PRELOAD)
    yield made
    made.close()


@pytest.fixture
def provider(nodes, shared_provider):  # noqa: F811 -- the fixture imported above
    yield from nodes.lend(shared_provider)


def node_of(provider: RayProvider, machine_id: str) -> str:
    return next(m.tags["ray-node"] for m in provider.all_machines() if m.id == machine_id)


def test_hypersched_runs_trials_on_both_machines_and_grows_one_across_them(provider, tmp_path):
    machines = provider.provision("local-a", 2, "spot")
    assert len({node_of(provider, m.id) for m in machines}) == 2
    configs = ConfigList([{"lr": 0.3, "samples": 2048}, {"lr": 0.002, "hidden": 4, "samples": 2048}])
    scheduler = HyperSched(min_iterations=1, eta=2, max_iterations=8, scaling="LINEAR", cooldown=1,
                           use_idle_atoms=False)
    with WorldExecutor(EXAMPLE, tmp_path, provider=provider, start_timeout_s=90, iteration_timeout_s=60) as executor:
        result = run_experiment(scheduler, executor, configs, total_atoms=2, max_iterations=8, deadline=150)
    assert_reaped(executor)
    best, worse = result.trials
    assert result.end_reason == "exhausted" and not result.failed
    assert best.state == TrialState.COMPLETED and best.iteration == 8 and best.last_metric > 0.6
    assert worse.state == TrialState.PAUSED and worse.iteration < best.iteration

    first = [r for r in executor.launches if r.from_iteration == 0]
    assert sorted(m for r in first for m in r.machines) == sorted(m.id for m in machines)  # one trial on each
    [grown] = [r for r in executor.launches if r.trial_id == 0 and r.from_iteration > 0]
    assert grown.atoms == 2 and sorted(grown.machines) == sorted(m.id for m in machines)  # a world across both
    assert best.resizes == 1 and best.iteration_atoms[0] == 1 and best.iteration_atoms[-1] == 2
    assert all(o > 0 for t in result.trials for o in t.overheads_s)


def test_a_plan_runs_stage_by_stage_and_gives_back_a_machine(provider, tmp_path):
    plan = {"stages": [
        {"trials": 2, "iters_per_trial": 1, "instances": 2, "gpus_per_trial": 1, "instance_type": "local-a"},
        {"trials": 1, "iters_per_trial": 2, "instances": 1, "gpus_per_trial": 1, "instance_type": "local-a"}]}
    configs = ConfigList([{"lr": 0.3}, {"lr": 0.003, "hidden": 4}])
    with WorldExecutor(EXAMPLE, tmp_path, provider=provider, start_timeout_s=90, iteration_timeout_s=60) as executor:
        result = execute_plan(plan, executor, provider, configs, market="spot")
    assert_reaped(executor)
    first, second = result.stages
    assert len(first.machines) == 2 and second.released == 1 and len(second.machines) == 1
    assert not result.failed
    stage0 = [r for r in executor.launches if r.from_iteration == 0]
    assert sorted(r.machines[0] for r in stage0) == sorted(first.machines)  # one trial on each machine
    for k, record in enumerate(result.stages):
        check_placements(record, 1)
        for trial_id in record.trial_ids:  # each trial ran where the placement controller put it
            where = next(p[str(trial_id)] for p in record.placements if str(trial_id) in p)
            [launch] = [r for r in executor.launches if r.trial_id == trial_id and r.from_iteration == k]
            assert sorted(launch.machines) == sorted(m for m, n in where.items() for _ in range(n))
    winner = result.trials[second.trial_ids[0]]
    assert winner.state == TrialState.COMPLETED and winner.iteration == 3
    assert provider.machines() == []  # every machine given back at the end
    assert {m.id for m in provider.all_machines() if m.terminated_at is not None} >= set(first.machines)


def iterate(executor: WorldExecutor, trial: Trial, iterations: int) -> None:
    """`iterations` results of the running `trial` (the first one already under way), kept in its history."""
    for k in range(iterations):
        if k:
            executor.proceed(trial)
        event = executor.next_event(executor.clock.now() + 90)
        assert isinstance(event, Report) and event.trial_id == trial.trial_id, event
        assert event.iteration == trial.iteration + 1
        trial.metrics.append(event.metric)


def test_a_trial_paused_on_one_node_resumes_on_the_other_from_its_s3_checkpoint(provider, s3, tmp_path):
    bucket = f"thrifty-tuning-{uuid.uuid4().hex[:12]}"
    s3.client("s3").create_bucket(Bucket=bucket)
    storage = f"s3://{bucket}/run"
    first, second = provider.provision("local-a", 2, "spot")
    assert node_of(provider, first.id) != node_of(provider, second.id)
    config = {"lr": 0.3, "momentum": 0.5, "samples": 256}
    moved, reference = Trial(0, config), Trial(1, config)
    with WorldExecutor(LOOP, tmp_path / "driver", storage=storage, provider=provider, start_timeout_s=90,
                       iteration_timeout_s=60, metric="accuracy") as executor:
        executor.launch(moved, 1, where={first.id: 1})
        iterate(executor, moved, 3)
        moved.checkpoint = executor.suspend(moved)  # a pause: checkpointed to S3, the ranks gone
        assert moved.checkpoint == {"path": f"{storage}/trial-0/checkpoint.pt", "iteration": 3,
                                    "save_s": moved.checkpoint["save_s"], "bytes": moved.checkpoint["bytes"]}
        saved = load_checkpoint(moved.checkpoint["path"])
        # the loop's own state, at the end of its third epoch (256 samples, the loop's default batch of 32)
        assert saved is not None and saved["iteration"] == 3 and saved["step"] == 3 * 8
        assert saved["state_keys"] == ["model", "optimizer", "schedule"] and saved["global_batch"] == 32

        executor.launch(moved, 1, where={second.id: 1})  # resumed on the other machine
        iterate(executor, moved, 3)
        executor.terminate(moved)
        executor.launch(reference, 1, where={first.id: 1})  # the same trial, never paused
        iterate(executor, reference, 6)
        executor.terminate(reference)
    assert_reaped(executor)
    paused, resumed, _ = executor.launches
    assert paused.machines == [first.id] and resumed.machines == [second.id]
    assert resumed.from_iteration == 3 and resumed.restore_s is not None and resumed.restore_s > 0
    # it went on from its checkpoint (model, optimizer, schedule, data position, random state): the same curve,
    # bit for bit
    assert moved.metrics == reference.metrics and len(moved.metrics) == 6 and moved.metrics[-1] > 0.5
    assert load_checkpoint(f"{storage}/trial-0/checkpoint.pt")["iteration"] == 6
    # nothing went through a file: the driver's folder holds the worker logs and no checkpoint
    assert sorted(p.name for p in (tmp_path / "driver").rglob("*") if p.is_file()) == ["rank0.log"] * 2
