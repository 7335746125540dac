"""Training plans on a Ray cluster: three Ray nodes on this host, every one
bound to 127.0.0.1 (`ray.cluster_utils.Cluster`), running the Srifty 5.4
miniature (``datasets/examples/local-demo-srifty54.json``) with the float64
MLP. Removing a node is the preemption; a local IMDSv2 server per node posts
spot notices, which the node's agent reads (``THRIFTY_IMDS_URL`` in the
node's environment)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from dataclasses import replace

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed; `pip install 'thrifty[ray]'` runs these tests")
torch = pytest.importorskip("torch")

from thrifty.datasets.catalog import load_catalog  # noqa: E402
from thrifty.core.errors import ProblemError  # noqa: E402
from thrifty.runtime.cluster.provider import RayProvider  # noqa: E402
from thrifty.runtime.ddp.steps import single_process_reference  # noqa: E402
from thrifty.runtime.training import RunConfig, train  # noqa: E402
from thrifty.runtime.training.faults import SlowWorker  # noqa: E402
from thrifty.runtime.training.launcher import WORKER_PRELOAD  # noqa: E402
from thrifty.solver import solve  # noqa: E402

from cluster_profiling import assert_costs, assert_gave_everything_back  # noqa: E402
from ray_cluster import ThreeNodes  # noqa: E402
from test_training_runtime_processes import max_difference, model_state  # noqa: E402
from test_training_runtime_units import plan_dict  # noqa: E402

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "datasets" / "examples" / "local-demo-srifty54.json"
CATALOG = ROOT / "datasets" / "examples" / "local-demo-catalog.json"
TINY = "thrifty.runtime.training.examples:tiny_mlp"
CONFIG = RunConfig(checkpoint_every=50, checkpoint_every_s=None, poll_s=0.02, world_timeout_s=120,
                   stall_timeout_s=120, stop_timeout_s=60, collective_timeout_s=120)


@pytest.fixture(scope="module")
def nodes():
    cluster = ThreeNodes()
    yield cluster
    cluster.close()


def make_provider(nodes) -> RayProvider:
    nodes.refill()
    return RayProvider("cluster-test", load_catalog(CATALOG), nodes.cluster.address, imds_interval_s=0.2,
                       preload=WORKER_PRELOAD)


@pytest.fixture(scope="class")
def plan_provider(nodes):
    """One provider for the tests that run a plan (`TestPlans`): its agents and their fork servers, warm,
    serve every run (as they serve a run's re-plans); closed, with its connection to Ray, before the tests
    whose commands connect on their own."""
    made = make_provider(nodes)
    yield made
    made.close()


@pytest.fixture
def provider(nodes, plan_provider):
    yield from nodes.lend(plan_provider)


@pytest.fixture(scope="module")
def demo_plan() -> dict:
    """The demo problem's own plan (2 x local-a spot, 32 each)."""
    return solve(DEMO).model_dump()


@pytest.fixture(scope="module")
def demo(nodes, demo_plan, tmp_path_factory) -> Path:
    """The demo problem with its limits (30 s, $0.05) scaled to how long this
    host takes to launch the plan's world right now, measured on this cluster.

    The demo's limits assume launches of ``overheads.launch_s`` (5 s). A
    re-plan charges the launch the run measured, so on a loaded host (a launch
    of 21 s) the re-plan after a preemption found no plan in what was left of
    30 s: the test measured the host, not the runtime. Here a first world of
    the plan runs 10 iterations, and the limits grow by 1.5 x its launch /
    5 s when that is over 1 (1.5: the cold launch's other costs, and load
    that changes during the test); the plan stays the demo's own, so a
    quiet host runs the very same test."""
    folder = tmp_path_factory.mktemp("demo")
    problem = {**json.loads(DEMO.read_text()), "catalog": str(CATALOG)}
    made = make_provider(nodes)
    try:
        probe = train(demo_plan, TINY, problem={**problem, "iterations": 10}, provider=made,
                      run_dir=folder / "probe", config=CONFIG)
    finally:
        made.close()
    launch_s = probe.segments[0].launch_s or 0.0
    scale = max(1.0, 1.5 * launch_s / problem["overheads"]["launch_s"])
    problem["limits"] = {k: v * scale for k, v in problem["limits"].items()}
    print(f"the demo's limits x {scale:.2f}: a launch took {launch_s:.1f} s")
    path = folder / "demo.json"
    path.write_text(json.dumps(problem))
    return path


class WhenReaching:
    """An on_progress callback that runs `action` once, in a thread, when the
    run reaches `iteration`; `join` waits for the action to end."""

    def __init__(self, iteration: int, action) -> None:
        self.iteration, self.action = iteration, action
        self.thread: threading.Thread | None = None

    def __call__(self, snapshot) -> None:
        if self.thread is None and snapshot.iterations >= self.iteration:
            self.thread = threading.Thread(target=self.action, daemon=True)
            self.thread.start()

    def join(self) -> None:
        assert self.thread is not None, f"the run never reached iteration {self.iteration}"
        self.thread.join(60)

    def __enter__(self) -> WhenReaching:
        return self

    def __exit__(self, *exc) -> None:
        """On every way out, also a failed run: the action must not hit the next test's cluster."""
        if self.thread is not None:
            self.thread.join(60)


class TestPlans:
    """Plans run on the cluster, each on the one provider of the class (`plan_provider`)."""

    def test_a_plan_runs_on_the_cluster_and_trains_like_one_process(self, provider, demo, demo_plan, tmp_path):
        result = train(demo_plan, TINY, problem=demo, provider=provider, run_dir=tmp_path, config=CONFIG)
        assert result.iterations == 600 and result.within_limits
        [segment] = result.segments
        assert segment.config == "2xlocal-a@32" and segment.ended == "finished"
        assert {m.host for m in provider.all_machines()} == {"127.0.0.1"}
        assert max_difference(model_state(result.checkpoint_path), single_process_reference(TINY, 64, 600)) < 1e-6
        assert provider.machines() == []


    def test_a_loop_named_by_its_file_runs_on_the_cluster_like_one_process(self, provider, demo, demo_plan, tmp_path,
                                                                           monkeypatch):
        """A job named by its file (issue 35: the README's user-loop example, ``path/to/train.py:train``) is
        imported by its path in the driver and in every rank on the cluster's nodes."""
        monkeypatch.chdir(ROOT)
        job = "datasets/examples/cnn/train.py:train"
        args = {"precision": "fp32", "samples": 96, "held_out": 16, "size": 8, "channels": 2, "width": 4, "classes": 3}
        problem = {**json.loads(demo.read_text()), "iterations": 6}
        result = train(demo_plan, job, trainer_args=args, problem=problem, provider=provider, run_dir=tmp_path / "ray",
                       config=CONFIG)
        assert [s.config for s in result.segments] == ["2xlocal-a@32"] and result.iterations == 6
        single = train(plan_dict(("local-a", "spot", 1, 64)), job, trainer_args=args, problem=problem,
                       run_dir=tmp_path / "single", config=CONFIG)
        assert max_difference(model_state(result.checkpoint_path), model_state(single.checkpoint_path)) < 1e-6


    def test_a_node_removed_mid_run_replans_and_finishes_like_an_uninterrupted_run(self, nodes, provider, demo,
                                                                                 demo_plan, tmp_path):
        # from the removal on, each iteration takes 20 ms longer (the world's pace is its slowest machine's), so
        # the run's last 300 iterations cannot outrun Ray's removal of the node on a loaded host (6 s at least);
        # a slowdown re-plan is off, as this test is about the loss alone
        slow = SlowWorker(0, 300, 0.02)
        with WhenReaching(300, nodes.remove_spare) as remove:
            result = train(demo_plan, TINY, problem=demo, provider=provider, run_dir=tmp_path,
                           config=replace(CONFIG, replan_on_slowdown=False), faults=[slow], on_progress=remove)
            remove.join()
        assert result.iterations == 600 and result.within_limits, result.exceeded
        [event] = result.preemptions
        assert (event.instance_type, event.market, event.time_left_s) == ("local-a", "spot", 0)
        assert event.source in ("worker-exit", "node-lost")
        lost, after = result.segments
        assert lost.ended == "lost" and lost.committed_iteration >= 300 - 50
        assert after.start_iteration == lost.committed_iteration and after.ended == "finished"
        assert "2xlocal-a" not in after.config
        assert max_difference(model_state(result.checkpoint_path), single_process_reference(TINY, 64, 600)) < 1e-6


    def test_a_spot_notice_ten_seconds_ahead_loses_no_iteration(self, nodes, provider, demo, demo_plan, tmp_path):
        def notice_then_remove() -> None:
            nodes.imds["spare"].interrupt(in_s=10.0)
            time.sleep(10.0)
            nodes.remove_spare()

        with WhenReaching(300, notice_then_remove) as notice:
            result = train(demo_plan, TINY, problem=demo, provider=provider, run_dir=tmp_path, config=CONFIG,
                           on_progress=notice)
            notice.join()  # the machine is taken 10 s after its notice: by then the run had moved off it
        assert result.iterations == 600 and result.within_limits, result.exceeded
        [event] = result.preemptions
        assert (event.source, event.instance_type, event.market) == ("imds", "local-a", "spot")
        assert 0 < event.time_left_s <= 10
        noticed, after = result.segments
        assert noticed.ended == "stopped" and noticed.lost_iterations == 0
        assert sum(s.lost_iterations for s in result.segments) == 0
        assert max_difference(model_state(result.checkpoint_path), single_process_reference(TINY, 64, 600)) < 1e-6


    def test_a_cluster_without_the_plans_machines_is_a_clear_error_before_anything_runs(self, provider, tmp_path):
        plan = plan_dict(("local-b", "spot", 2, 32))
        with pytest.raises(ProblemError) as error:
            train(plan, TINY, problem=DEMO, provider=provider, run_dir=tmp_path, config=CONFIG)
        assert error.value.path == "cluster"
        assert "2 x local-b (spot): the cluster has 0" in str(error.value)
        assert "local-a (spot)" in str(error.value)
        assert not (tmp_path / "checkpoint.pt").exists()


def probe_args(nodes, out, world_sizes: str) -> list[str]:
    return ["probe-allreduce", "--cluster", nodes.cluster.address, "--instance-type", "local-a", "--market", "spot",
            "--catalog", str(CATALOG), "--world-sizes", world_sizes, "--min-bytes", "1KiB", "--max-bytes", "64KiB",
            "--size-factor", "8", "--repeats", "2", "--warmup", "0", "--concurrency", "2", "--load-ms", "0",
            "--out", str(out), "--no-progress"]


def test_probe_allreduce_measures_across_the_clusters_machines_in_one_command(nodes, tmp_path, capsys):
    import csv

    from thrifty.runtime.cli import main

    nodes.refill()
    out = tmp_path / "probes.csv"
    assert main(probe_args(nodes, out, "2")) == 0
    rows = list(csv.DictReader(out.open()))
    # 1 KiB, 8 KiB, 64 KiB x concurrency 1, 2 x 2 repeats, on 2 machines of one rank each
    assert len(rows) == 12
    assert {(r["instance_type"], r["world_size"], r["instances"], r["backend"]) for r in rows} == {
        ("local-a", "2", "2", "gloo")}
    assert all(float(r["seconds"]) > 0 for r in rows)
    assert "--cluster" in capsys.readouterr().out  # the reproduce line names the cluster


def test_probe_allreduce_on_a_cluster_without_enough_machines_is_a_clear_error(nodes, tmp_path, capsys):
    from thrifty.runtime.cli import main

    nodes.refill()
    assert main(probe_args(nodes, tmp_path / "probes.csv", "2,3")) == 1
    err = capsys.readouterr().err
    assert "2 free local-a (spot) nodes, 3 wanted" in err
    assert not (tmp_path / "probes.csv").exists()


# -- profiles measured on the cluster's machines (thrifty profile / profile-scaling --cluster) -----------------------

MLP = "thrifty.runtime.measure.zoo:mlp"


@pytest.fixture(scope="module")
def spot_b(nodes):
    """A local-b spot node beside the three, so that one market offers both types (the tests below take a
    machine of each); removed at the end of the module, whose last tests these are."""
    from ray_cluster import NODE

    node = nodes.cluster.add_node(**NODE, resources={"thrifty-type:local-b": 1, "thrifty-market:spot": 1})
    nodes.cluster.wait_for_nodes()
    yield node
    nodes.cluster.remove_node(node)


def test_profile_on_the_cluster_measures_each_type_on_its_own_machine_and_gives_it_back(
        nodes, spot_b, providers, tmp_path, capsys):
    from thrifty.perfmodels.bundle import load_bundle
    from thrifty.runtime.cli import main

    nodes.refill()
    out = tmp_path / "mlp.json"
    argv = ["profile", MLP, "--cluster", nodes.cluster.address, "--instance-types", "local-a,local-b",
            "--market", "spot", "--catalog", str(CATALOG), "--batches", "1,2", "--repeats", "2", "--warmup", "1",
            "--rounds", "1", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    bundle = load_bundle(out)
    assert (bundle.kind, bundle.model, bundle.market) == ("compute", "mlp", "spot")
    profiles = bundle.compute_profiles()
    assert sorted(profiles) == ["local-a", "local-b"]
    for profile in profiles.values():
        assert profile.device == "cpu" and [p.batch for p in profile.points] == [1, 2]
        assert profile.provenance.kind == "measured" and "--cluster" in (profile.provenance.command or "")
    [provider] = providers
    assert_gave_everything_back(provider, {"local-a": 1, "local-b": 1})
    assert_costs(bundle, {"local-a": 0.4, "local-b": 0.55}, printed)

    # a problem names the bundle as its model, as it names one profile file
    problem = {**json.loads(DEMO.read_text()), "catalog": str(CATALOG), "model": str(out), "global_batch": 4,
               "batch_sizes": [1, 2], "limits": {"time_s": 3600}}
    plan = solve(problem)
    assert plan.status == "optimal" and plan.allocation


def test_profile_scaling_on_the_cluster_spans_machines_and_measures_their_launch(nodes, providers, tmp_path, capsys):
    from thrifty.perfmodels.bundle import load_bundle
    from thrifty.perfmodels.scaling import ScalingProfileFile
    from thrifty.runtime.cli import main
    from thrifty.solver.problem import parse_problem
    from thrifty.solver.tuning import TuningSpace

    nodes.refill()
    out = tmp_path / "scaling.json"
    argv = ["profile-scaling", MLP, "--cluster", nodes.cluster.address, "--instance-types", "local-a",
            "--market", "spot", "--catalog", str(CATALOG), "--world-sizes", "1,2", "--batch", "4",
            "--iterations", "2", "--warmup", "1", "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    bundle = load_bundle(out)
    assert (bundle.kind, sorted(bundle.profiles)) == ("scaling", ["local-a"])
    document = ScalingProfileFile.model_validate(bundle.profiles["local-a"])
    assert [p.gpus for p in document.points] == [1, 2] and document.instance_type == "local-a"
    [provider] = providers
    assert_gave_everything_back(provider, {"local-a": 2})  # world size 2: one rank on each of two machines
    assert_costs(bundle, {"local-a": 0.4}, printed)
    assert bundle.machines["local-a"].count == 2

    # a tuning problem naming the bundle takes its SCALE and INIT latencies, unless its cloud states them
    measured = bundle.machines["local-a"]
    tuning = {"kind": "tuning", "model": str(out), "instance_type": "local-a", "catalog": str(CATALOG),
              "market": "spot", "deadline_s": 3600, "samples": 10,
              "experiment": {"algorithm": "sha", "trials": 4, "min_iters": 1, "max_iters": 4, "eta": 2}}
    cloud = TuningSpace(parse_problem(tuning)).clouds["local-a"]
    assert (cloud.scale_latency_s, cloud.init_latency_s) == (measured.scale_latency_s, measured.init_latency_s)
    stated = TuningSpace(parse_problem({**tuning, "cloud": {"init_latency_s": 7}})).clouds["local-a"]
    assert (stated.scale_latency_s, stated.init_latency_s) == (measured.scale_latency_s, 7)
    # and the tuning plan says where each came from
    said = TuningSpace(parse_problem({**tuning, "cloud": {"init_latency_s": 7}})).provenance()["local-a"]
    assert (said.scale_latency.kind, said.scale_latency.seconds) == ("measured", measured.scale_latency_s)
    assert (said.init_latency.kind, said.compute.kind) == ("stated", "measured")


def test_profile_scaling_of_a_job_on_the_cluster_runs_its_own_loop_there(nodes, providers, tmp_path):
    """A loop function's scaling profile, measured on the cluster's machines (issue 35)."""
    from thrifty.perfmodels.bundle import load_bundle
    from thrifty.perfmodels.scaling import ScalingProfileFile
    from thrifty.runtime.cli import main

    nodes.refill()
    out = tmp_path / "loop-scaling.json"
    argv = ["profile-scaling", "thrifty.runtime.training.examples:mlp_loop", "--job-args", '{"hidden": 12}',
            "--cluster", nodes.cluster.address, "--instance-types", "local-a", "--market", "spot", "--catalog",
            str(CATALOG), "--world-sizes", "1,2", "--batch", "4", "--iterations", "2", "--warmup", "1", "--out",
            str(out), "--no-progress"]
    assert main(argv) == 0
    document = ScalingProfileFile.model_validate(load_bundle(out).profiles["local-a"])
    assert [p.gpus for p in document.points] == [1, 2] and all(p.iteration_s > 0 for p in document.points)
    assert document.iteration.startswith("one iteration of the job's own loop")
    assert '{"hidden": 12}' in str(document.provenance.notes)
    [provider] = providers
    assert_gave_everything_back(provider, {"local-a": 2})


def test_profiling_a_type_the_cluster_lacks_is_a_one_line_error_before_any_machine_is_taken(nodes, providers,
                                                                                            tmp_path, capsys):
    from thrifty.runtime.cli import main

    nodes.refill()
    out = tmp_path / "mlp.json"
    argv = ["profile", MLP, "--cluster", nodes.cluster.address, "--instance-types", "local-a",
            "--market", "on_demand", "--catalog", str(CATALOG), "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "1 x local-a (on_demand): the cluster has 0" in err
    [provider] = providers
    assert provider.all_machines() == [] and not out.exists()


def test_profile_of_a_job_on_the_cluster_goes_to_the_job_cache_and_prices_its_problem(
        nodes, providers, tmp_path, capsys, monkeypatch):
    """A job (a loop function, issue 35) measured on a cluster's machine of its type: its profile is cached
    for that type, and a problem naming the job solves with it."""
    from thrifty.perfmodels.job_profiles import CACHE_ENV, job_key, profile_path
    from thrifty.perfmodels.profile import load_profile
    from thrifty.runtime.cli import main

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    nodes.refill()
    job, args = "thrifty.runtime.training.examples:mlp_loop", {"hidden": 8}
    argv = ["profile", job, "--job-args", json.dumps(args), "--cluster", nodes.cluster.address,
            "--instance-types", "local-a", "--market", "spot", "--catalog", str(CATALOG), "--batches", "1,2",
            "--repeats", "2", "--warmup", "1", "--rounds", "1", "--no-progress"]
    assert main(argv) == 0
    profile = load_profile(profile_path(job_key(job, args), instance_type="local-a"))
    assert profile.extra["job"]["spec"] == job and "--cluster" in (profile.provenance.command or "")
    [provider] = providers
    assert_gave_everything_back(provider, {"local-a": 1})
    problem = {"kind": "training", "job": job, "job_args": args, "catalog": str(CATALOG), "global_batch": 4,
               "iterations": 10, "batch_sizes": [1, 2], "instances": [{"instance_type": "local-a", "quota": 2}]}
    plan = solve(problem)
    assert plan.status == "optimal" and plan.allocation
