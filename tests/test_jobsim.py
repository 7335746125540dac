"""RubberBand 4.2 job simulator: specs, DAG construction and costs checked by hand."""


import numpy as np
import pytest

from thrifty.core.errors import ProblemError
from thrifty.perfmodels.experiment import ExperimentSpec, hyperband_spec, sha_spec
from thrifty.perfmodels.jobsim import (JobSimulator, StageAllocation, build_dag, critical_path, wave_chains,
                                       dag_latencies, slots)
from thrifty.perfmodels.scaling import CloudProfile, ScalingProfile, load_scaling_profile


def test_sha_matches_rubberband_table3_and_6_1():
    assert [(s.trials, s.iters) for s in sha_spec(32, 1, 50, 3).stages] == [(32, 1), (10, 3), (3, 9), (1, 37)]
    spec = sha_spec(64, 4, 508, 2)
    assert [s.trials for s in spec.stages] == [64, 32, 16, 8, 4, 2, 1]
    assert sum(s.iters for s in spec.stages) == 508
    assert sum(s.iters for s in sha_spec(512, 4, 4096).stages) == 4096


def test_hyperband_concatenates_brackets():
    spec = hyperband_spec(1, 9, 3)  # s_max = 2: brackets SHA(9, 1, 9), SHA(5, 3, 9), SHA(3, 9, 9)
    # cumulative iterations 1, 4, 9 | 3, 9 | 9
    assert [(s.trials, s.iters) for s in spec.stages] == [(9, 1), (3, 3), (1, 5), (5, 3), (1, 6), (3, 9)]


@pytest.mark.parametrize("args, path", [((4, 10, 5, 2), "experiment.min_iters"), ((4, 1, 5, 1), "experiment.eta"),
                                        ((0, 1, 5, 2), "experiment.trials")])
def test_bad_sha_names_the_field(args, path):
    with pytest.raises(ProblemError) as e:
        sha_spec(*args)
    assert e.value.path == path


def _sim(billing="per_instance", sd=0.0, data=0.0, min_billed=60.0, init_sd=0.0, samples=50):
    spec = ExperimentSpec.explicit([(4, 2), (2, 3)])
    prof = ScalingProfile("toy", "box", (1, 2), (10.0, 6.0), (sd, sd))
    cloud = CloudProfile("box", 2, 7.2, billing, min_billed, scale_latency_s=10, init_latency_s=5,
                         init_latency_sd_s=init_sd, data_usd_per_gb=0.5, dataset_gb=data)
    return JobSimulator(spec, {"box": prof}, {"box": cloud}, samples=samples, seed=3)


PLAN = (StageAllocation(1, 1), StageAllocation(2, 2))


def test_dag_queued_trials_scale_up_and_sync_barriers():
    nodes = build_dag(_sim().spec, PLAN, {None: 2})
    kinds = [v.kind for v in nodes]
    # stage 0: SCALE, 1 INIT, 4 TRAIN (2 slots: trials 2 and 3 queue), SYNC
    # stage 1: SCALE, 1 INIT (one new instance), 2 TRAIN, SYNC
    assert kinds == ["SCALE", "INIT_INSTANCE", "TRAIN", "TRAIN", "TRAIN", "TRAIN", "SYNC",
                     "SCALE", "INIT_INSTANCE", "TRAIN", "TRAIN", "SYNC"]
    assert nodes[0].deps == () and nodes[1].deps == (0,)
    assert nodes[2].deps == (1,) and nodes[3].deps == (1,)
    assert nodes[4].deps == (2,) and nodes[5].deps == (3,)           # chained behind trials 0 and 1
    assert nodes[6].deps == (2, 3, 4, 5)                             # SYNC waits for every TRAIN
    assert nodes[7].deps == (6,)                                     # scale-up after the barrier
    assert nodes[9].deps == (8,) and nodes[11].deps == (9, 10)


def test_no_scale_node_when_the_cluster_shrinks():
    nodes = build_dag(_sim().spec, (StageAllocation(1, 2), StageAllocation(1, 1)), {None: 2})
    assert [v.kind for v in nodes].count("SCALE") == 1
    # stage 0: SCALE, 2 INIT, 4 TRAIN (4 slots), SYNC (node 7); stage 1 trains right after it
    assert nodes[8].kind == "TRAIN" and nodes[8].deps == (7,)


def test_deterministic_jct_and_per_instance_cost_by_hand():
    r = _sim().simulate(PLAN)
    stage0 = 10 + 5 + 2 * (2 * 10.0)      # two waves of 2 iterations at 10 s
    stage1 = 10 + 5 + 3 * 6.0             # scale-up, then 3 iterations at 6 s on 2 GPUs
    assert r.jct_s == pytest.approx(stage0 + stage1)
    per_s = 7.2 / 3600
    first = (stage0 - 10) + stage1        # billed from the end of its SCALE to the last SYNC
    second = max(stage1 - 10, 60.0)       # 23 s lifetime, billed the 60 s minimum
    assert r.cost_usd == pytest.approx(per_s * (first + second))
    assert r.jct_s_p95 == pytest.approx(r.jct_s)


def test_per_function_cost_and_data_ingress_by_hand():
    r = _sim("per_function", data=2.0).simulate(PLAN)
    per_gpu_s = 7.2 / 3600 / 2
    busy = 4 * 1 * 20.0 + 2 * 2 * 18.0
    assert r.cost_usd == pytest.approx(per_gpu_s * busy + 2 * 0.5 * 2.0)
    assert r.data_usd == pytest.approx(2.0)


def test_critical_path_of_the_dag_equals_the_stagewise_simulation():
    sim = _sim(sd=3.0, init_sd=2.0)
    plan = (StageAllocation(1, 1), StageAllocation(1, 3))
    nodes = build_dag(sim.spec, plan, {None: 2})
    jct = critical_path(nodes, dag_latencies(sim, plan, nodes))
    np.testing.assert_allclose(jct, sim.simulate(plan).jct_samples)


def test_stragglers_are_paid_for_only_under_per_instance_billing():
    a = _sim("per_instance", sd=4.0, min_billed=0).simulate(PLAN)
    b = _sim("per_function", sd=4.0, min_billed=0).simulate(PLAN)
    # per-instance pays at least the busy GPU time, plus the idle time at the barriers
    assert a.cost_usd > b.cost_usd
    assert a.jct_s_p95 > a.jct_s


def test_placement_rule_slots():
    assert slots(1, 3, 4) == 12 and slots(3, 3, 4) == 3 and slots(8, 5, 4) == 2


def test_shipped_profiles_scale_sublinearly():
    p = load_scaling_profile("resnet101", "p3.8xlarge")
    t = [p.iteration(g)[0] for g in (1, 2, 4, 8)]
    assert t == sorted(t, reverse=True)
    assert 1 * t[0] < 2 * t[1] < 4 * t[2] < 8 * t[3]  # GPU-seconds per iteration grow with g


def test_spot_preemptions_add_time_and_cost():
    spec = sha_spec(8, 2, 8, 2)
    prof = load_scaling_profile("resnet50", "p3.8xlarge")
    base = CloudProfile("p3.8xlarge", 4, 2.0, scale_latency_s=15, init_latency_s=15)
    spot = CloudProfile("p3.8xlarge", 4, 2.0, scale_latency_s=15, init_latency_s=15, market="spot",
                        preemptions_per_hour=50.0)
    plan = tuple(StageAllocation(1, 2) for _ in spec.stages)
    r0 = JobSimulator(spec, {"p3.8xlarge": prof}, {"p3.8xlarge": base}).simulate(plan)
    r1 = JobSimulator(spec, {"p3.8xlarge": prof}, {"p3.8xlarge": spot}).simulate(plan)
    assert r1.jct_s > r0.jct_s and r1.cost_usd > r0.cost_usd


@pytest.mark.parametrize("n,parallel", [(12, 4), (13, 4), (3, 5), (1, 1), (7, 7)])
def test_wave_chains_are_each_slot_s_trials_in_order(n, parallel):
    # trial j runs in slot j mod parallel after trial j - parallel: each slot's busy time is the sum of its trials
    lat = np.random.default_rng(n).uniform(1, 2, size=(n, 3))
    expected = np.array([lat[j::parallel].sum(axis=0) for j in range(parallel)])
    assert np.allclose(wave_chains(lat, parallel), expected)
