"""The iteration simulator against cases computed by hand (Srifty 4.3)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thrifty.datasets.catalog import Catalog
from thrifty.core.errors import ProblemError
from thrifty.perfmodels.bandwidth import bus_bandwidth_from_time
from thrifty.perfmodels.cluster import MachineGroup, parse_cluster
from thrifty.perfmodels.compute import ComputeModel
from thrifty.perfmodels.library import ModelLibrary
from thrifty.perfmodels.profile import ComputeProfile
from thrifty.perfmodels.simulator import IterationSimulator, ddp_buckets, exchange_time

from helpers import FixedBandwidth, compute_model, instance, profile_dict


def _sim(models, bandwidth, transfer="layer", samples=64):
    lib = ModelLibrary(paths=[])
    for m in models:
        lib.add(m)
    return IterationSimulator("m", library=lib, bandwidth=bandwidth, samples=samples, transfer=transfer)


def test_busbw_conversion():
    # 2 workers, 1e6 bytes in 1 ms: busbw = 2 * 1e6 * 1 / (2 * 1e-3) = 1e9
    assert bus_bandwidth_from_time(1e6, 2, 1e-3) == pytest.approx(1e9)
    # 4 workers: 2 * s * 3 / (4 t)
    assert bus_bandwidth_from_time(8e6, 4, 0.01) == pytest.approx(2 * 8e6 * 3 / (4 * 0.01))


def test_single_transfer_alone():
    # work 10 bus-bytes at 5 B/s, starting at 1 s
    assert exchange_time([1.0], [10.0], [5.0], cap=100.0) == pytest.approx(3.0)


def test_two_concurrent_transfers_share_capped_bandwidth():
    # both start at 0, b_bus 10 each, cap 10: b_agg 20 >= cap, each min(10, 10/2) = 5
    assert exchange_time([0.0, 0.0], [10.0, 10.0], [10.0, 10.0], cap=10.0) == pytest.approx(2.0)


def test_two_transfers_under_the_cap_keep_their_bandwidth():
    assert exchange_time([0.0, 0.0], [10.0, 10.0], [4.0, 4.0], cap=10.0) == pytest.approx(2.5)


def test_three_concurrent_transfers_recompute_on_each_finish():
    # b_bus 4 each, cap 10: three active -> b_agg 12 >= 10 -> each 10/3.
    # first (work 10) done at t=3; the others have 20-10 and 30-10 left.
    # two active -> b_agg 8 < 10 -> each 4: second done at 3 + 10/4 = 5.5;
    # third has 20 - 10 = 10 left at 4 B/s: done at 8.
    assert exchange_time([0.0, 0.0, 0.0], [10.0, 20.0, 30.0], [4.0, 4.0, 4.0], cap=10.0) == pytest.approx(8.0)


def test_late_start_joins_running_transfer():
    # A: work 10 at 10 B/s from 0. B starts at 0.5 (A has 5 left): cap 10 binds, each 5 B/s.
    # A finishes at 0.5 + 1 = 1.5; B then has 10 - 5 = 5 left alone at 10 B/s: done at 2.0.
    assert exchange_time([0.0, 0.5], [10.0, 10.0], [10.0, 10.0], cap=10.0) == pytest.approx(2.0)


def test_no_overlap_when_gradients_ready_at_the_end():
    # fw 0.01 + 0.001 B, bw 0.02 + 0.002 B at B=10: 0.02 and 0.04.
    # one layer of 1e6 bytes ready at the end of backward; 2 workers: work = 1e6 bus-bytes,
    # at 1e8 B/s that is 0.01 s after backward ends -> t_iter = 0.02 + 0.04 + 0.01
    cm = compute_model(layers=((1_000_000, 1.0),))
    sim = _sim([cm], FixedBandwidth(bus=1e8, cap=1e9))
    it = sim.simulate([MachineGroup(instance(), 2, 10)])
    assert it.forward_s == pytest.approx(0.02)
    assert it.backward_s == pytest.approx(0.04)
    assert it.exchange_s == pytest.approx(0.05)
    assert it.mean_s == pytest.approx(0.07)
    assert it.exposed_comm_s == pytest.approx(0.01)
    assert it.sd_s == pytest.approx(0.0, abs=1e-12)


def test_full_overlap_hides_communication():
    # ten small layers spread through backward, each 1e4 bytes at 1e9 B/s: 10 us each
    layers = tuple((10_000, (i + 1) / 10 * 0.9) for i in range(10))
    cm = compute_model(layers=layers)
    sim = _sim([cm], FixedBandwidth(bus=1e9, cap=1e10))
    it = sim.simulate([MachineGroup(instance(), 4, 10)])
    assert it.mean_s == pytest.approx(0.02 + 0.04)
    assert it.exposed_comm_s == 0.0


def test_slow_machine_bounds_mixed_cluster():
    fast = compute_model(device="fast", fw=(0.005, 0.0005), bw=(0.01, 0.001), layers=((1, 1.0),))
    slow = compute_model(device="slow", fw=(0.01, 0.001), bw=(0.02, 0.002), layers=((1, 1.0),))
    sim = _sim([fast, slow], FixedBandwidth(bus=1e12, cap=1e12))
    groups = [MachineGroup(instance("f", device="fast"), 3, 64), MachineGroup(instance("s", device="slow"), 1, 16)]
    it = sim.simulate(groups)
    # fast: fw 0.037, bw 0.074 at 64; slow: fw 0.026, bw 0.052 at 16 -> the fast type is slower here
    assert it.forward_s == pytest.approx(0.037)
    assert it.backward_s == pytest.approx(0.074)
    assert it.world_size == 4 and it.instances == 4


def test_mixed_cluster_uses_slowest_bandwidth():
    class PerType(FixedBandwidth):
        def bus_bandwidth(self, itype, sizes, world_size, instances):
            return np.full(len(sizes), 1e8 if itype.name == "a" else 2e8)

        def bandwidth_cap(self, itype, world_size, instances):
            return 1e9

    cm = compute_model(layers=((1_000_000, 1.0),))
    sim = _sim([cm], PerType(0, 0))
    it = sim.simulate([MachineGroup(instance("a"), 1, 10), MachineGroup(instance("b"), 1, 10)])
    assert it.exchange_s == pytest.approx(0.04 + 0.01)  # 1e6 bus-bytes at the slower 1e8 B/s


def test_variance_raises_mean_with_more_machines():
    cm = compute_model(cv=0.1, layers=((1, 1.0),))
    sim = _sim([cm], FixedBandwidth(bus=1e12, cap=1e12), samples=4096)
    one = sim.simulate([MachineGroup(instance(), 1, 32)])
    many = sim.simulate([MachineGroup(instance(), 64, 32)])
    assert one.mean_s == pytest.approx(cm.compute_s(32), rel=0.01)
    # E[max of 64 normals] ~ mu + 2.4 sd for each of forward and backward
    expected = cm.compute_s(32) + 2.4 * (cm.forward_sd_s(32) + cm.backward_sd_s(32))
    assert many.mean_s == pytest.approx(float(expected), rel=0.02)
    assert many.p95_s > many.mean_s


def test_results_are_reproducible_for_a_seed():
    cm = compute_model(cv=0.05)
    a = _sim([cm], FixedBandwidth(1e9, 1e10)).simulate([MachineGroup(instance(), 3, 16)])
    b = _sim([cm], FixedBandwidth(1e9, 1e10)).simulate([MachineGroup(instance(), 3, 16)])
    assert a == b


def test_multi_gpu_machine_splits_batch():
    cm = compute_model(layers=((1, 1.0),))
    sim = _sim([cm], FixedBandwidth(1e12, 1e12))
    it = sim.simulate([MachineGroup(instance(gpus=4), 1, 40)])
    assert it.forward_s == pytest.approx(0.02)  # 10 per GPU
    assert it.world_size == 4 and it.instances == 1


def test_ddp_buckets_close_at_cap():
    sizes, ready = ddp_buckets([600, 600, 300, 2000, 100], [0.1, 0.2, 0.3, 0.4, 0.9],
                               first_bucket_bytes=1000, bucket_bytes=2000)
    assert sizes.tolist() == [1200, 2300, 100]
    assert ready.tolist() == [0.2, 0.4, 0.9]


def test_batch_beyond_memory_is_an_error():
    cm = compute_model(max_batch=64, batches=(1, 2, 4, 8, 16, 32, 64))
    sim = _sim([cm], FixedBandwidth(1e9, 1e10))
    with pytest.raises(ProblemError, match="beyond the memory limit"):
        sim.simulate([MachineGroup(instance(), 1, 128)])


def test_missing_profile_lists_available():
    sim = _sim([compute_model(device="dev")], FixedBandwidth(1e9, 1e10))
    with pytest.raises(ProblemError, match="has profiles for: dev"):
        sim.simulate([MachineGroup(instance(device="other"), 1, 8)])


def test_parse_cluster():
    cat = Catalog("aws", "x", {"p": instance("p", gpus=4), "g": instance("g")}, "test", {})
    groups = parse_cluster("4xp@512+g@32", cat)
    assert [(g.instance_type.name, g.count, g.batch) for g in groups] == [("p", 4, 512), ("g", 1, 32)]
    with pytest.raises(ProblemError, match="not COUNTxTYPE@BATCH"):
        parse_cluster("4xp", cat)
    with pytest.raises(ProblemError, match="unknown instance type 'q'"):
        parse_cluster("q@3", cat)
    with pytest.raises(ProblemError, match="must be at least 1"):
        parse_cluster("0xp@3", cat)


def test_apm_is_linear_serial_and_variance_free():
    from thrifty.perfmodels.apm import AlphaBetaAllreduce, ApmSimulator

    cm = compute_model(cv=0.1, layers=((1_000_000, 0.2), (1_000_000, 0.4)))
    lib = ModelLibrary(paths=[])
    lib.add(cm)
    # alpha 0, beta 1e8: each 1e6-byte layer on 2 workers takes 2*1/2*1e6/1e8 = 0.01 s
    apm = ApmSimulator("m", library=lib, bandwidth=AlphaBetaAllreduce({"t.1": (0.0, 1e8)}))
    it = apm.simulate([MachineGroup(instance(), 2, 10)])
    # fw 0.02, bw 0.04, comm 0.02 (serial, fully overlapped from backward start)
    assert it.mean_s == pytest.approx(0.06)
    assert it.sd_s == 0.0 and it.p95_s == it.mean_s


def test_alpha_beta_fit_recovers_parameters():
    from thrifty.perfmodels.apm import AlphaBetaAllreduce

    n = np.array([2, 2, 2, 4, 4, 4])
    s = np.array([1e3, 1e5, 1e7, 1e3, 1e5, 1e7])
    t = 2 * (n - 1) * 50e-6 + 2 * (n - 1) / n * s / 1e9
    ab = AlphaBetaAllreduce.fit("x", n, s, t)
    alpha, beta = ab.params["x"]
    assert alpha == pytest.approx(50e-6, rel=1e-6)
    assert beta == pytest.approx(1e9, rel=1e-6)


def test_shared_core_devices_do_not_overlap_communication():
    # one 1e6-byte layer ready half-way through backward (0.04 s at B=10), 1e8 B/s on 2 workers:
    # a GPU overlaps it (0.02 + 0.01 < 0.04: hidden); a CPU worker sends it after backward
    layers = ((1_000_000, 0.5),)
    lib = ModelLibrary(paths=[])
    lib.add(compute_model(device="gpu", layers=layers))
    lib.add(compute_model(device="cpu", layers=layers))
    sim = IterationSimulator("m", library=lib, bandwidth=FixedBandwidth(1e8, 1e9), transfer="layer")
    gpu = sim.simulate([MachineGroup(instance("g", device="gpu"), 2, 10)])
    cpu = sim.simulate([MachineGroup(instance("c", device="cpu"), 2, 10)])
    assert gpu.mean_s == pytest.approx(0.06)
    assert cpu.mean_s == pytest.approx(0.07)


def _reference_exchange_time(starts, work, bus_bw, cap):
    """Srifty 4.3 read literally: at every event, every active transfer is re-rated to
    b_bus below the cap, else min(b_bus, cap / c), and all finish times recomputed.
    `bus_bw[j]`: a number, or b_bus per number of transfers in flight (1, 2, ...)."""
    rows = [b if isinstance(b, (list, tuple)) else [b] for b in bus_bw]
    left = list(work)
    active: list[int] = []
    t, i, n = 0.0, 0, len(starts)
    while i < n or active:
        c = len(active)
        b_bus = {j: rows[j][min(c, len(rows[j])) - 1] for j in active}
        agg = sum(b_bus.values())
        rates = {j: b_bus[j] if agg < cap else min(b_bus[j], cap / c) for j in active}
        t_finish = min((t + left[j] / rates[j] for j in active), default=math.inf)
        t_start = starts[i] if i < n else math.inf
        t_next = min(t_start, t_finish)
        for j in active:
            left[j] -= rates[j] * (t_next - t)
        t = t_next
        if t_start <= t_finish:
            while i < n and starts[i] <= t:
                active.append(i)
                i += 1
        else:
            done = min(active, key=lambda j: t + left[j] / rates[j] if rates[j] else math.inf)
            active.remove(done)
    return t


_RATE = st.floats(0.1, 3)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 3).flatmap(lambda levels: st.lists(
    st.tuples(st.floats(0, 1), st.floats(1e-3, 1),
              _RATE if levels == 0 else st.lists(_RATE, min_size=levels, max_size=levels)),
    max_size=25)), st.floats(0.5, 6))
def test_exchange_time_equals_the_literal_event_queue(transfers, cap):
    # bus bandwidth: one number per transfer, or one per number of transfers in flight
    transfers = sorted(transfers)
    starts, work, bus = ([x[k] for x in transfers] for k in range(3))
    assert exchange_time(starts, work, bus, cap) == pytest.approx(
        _reference_exchange_time(starts, work, bus, cap), rel=1e-9, abs=1e-12)


def test_concurrent_transfers_run_at_their_concurrent_bus_bandwidth():
    # two 1-unit transfers together: each at b(2) = 0.5 under the cap -> both end at 2;
    # then alone at b(1) = 1 they would have taken 1 each
    assert exchange_time([0.0, 0.0], [1.0, 1.0], [[1.0, 0.5], [1.0, 0.5]], cap=10.0) == pytest.approx(2.0)
    # the second starts late: 0.5 alone at rate 1, then both at 0.5 (the first finishes at 1.5),
    # then the second alone at 1 for its last 0.5
    assert exchange_time([0.0, 0.5], [1.0, 1.0], [[1.0, 0.5], [1.0, 0.5]], cap=10.0) == pytest.approx(2.0)


def _colocated_model(host_cores=None, **kw):
    data = profile_dict(device="cpu", **kw)
    # the same sweep with two workers on the host: 50% slower
    data["colocated"] = {"workers": 2, "host_cores": host_cores, "step_s": data["step_s"] * 1.5, "points": [
        {**p, "forward_s": 1.5 * p["forward_s"], "backward_s": 1.5 * p["backward_s"]} for p in data["points"]]}
    return ComputeModel.from_profile(ComputeProfile.model_validate(data))


def test_workers_sharing_the_host_run_at_the_colocated_profile():
    # fw 0.01 + 0.001 B, bw 0.02 + 0.002 B: at B=10 alone 0.02 + 0.04; co-located 1.5x
    sim = _sim([_colocated_model()], FixedBandwidth(1e12, 1e12))
    local, other = instance("local", device="cpu"), instance("c", device="cpu")
    alone = sim.simulate([MachineGroup(local, 1, 10)])
    assert alone.forward_s + alone.backward_s == pytest.approx(0.06)
    shared = sim.simulate([MachineGroup(local, 1, 10), MachineGroup(local, 1, 10)])
    assert shared.forward_s + shared.backward_s == pytest.approx(0.09)
    # two machines of another CPU type do not share a host
    apart = sim.simulate([MachineGroup(other, 2, 10)])
    assert apart.forward_s + apart.backward_s == pytest.approx(0.06)
    # bounds take the smaller of the two
    assert sim.device_stats(local, 10)[0] == pytest.approx(0.02)


def test_more_workers_than_host_cores_time_share_them():
    sim = _sim([_colocated_model(host_cores=2)], FixedBandwidth(1e12, 1e12))
    local = instance("local", device="cpu")
    two = sim.simulate([MachineGroup(local, 2, 10)])
    four = sim.simulate([MachineGroup(local, 4, 10)])  # 4 workers on 2 cores: each pass twice as long
    assert two.forward_s + two.backward_s == pytest.approx(0.09)
    assert four.forward_s + four.backward_s == pytest.approx(0.18)


def test_a_worker_done_early_leaves_the_host_to_the_others():
    # fw 0.01 + 0.001 B, bw 0.02 + 0.002 B alone, 1.5x co-located (2 workers, 2 cores). Batches 10 and 30:
    # co-located 0.09 s and 0.18 s of compute. The batch-10 worker is done at 0.09 s, when the other has done
    # half of its work; it does the other half alone (0.06 s of 0.12): 0.15 s, forward 0.05 and backward 0.10
    sim = _sim([_colocated_model(host_cores=2)], FixedBandwidth(1e12, 1e12))
    local = instance("local", device="cpu")
    mixed = sim.simulate([MachineGroup(local, 1, 10), MachineGroup(local, 1, 30)])
    assert mixed.forward_s == pytest.approx(0.05)
    assert mixed.backward_s == pytest.approx(0.10)
    # the same batches on machines that do not share a host: each alone
    apart = sim.simulate([MachineGroup(instance("c", device="cpu"), 1, 10),
                          MachineGroup(instance("c", device="cpu"), 1, 30)])
    assert apart.forward_s + apart.backward_s == pytest.approx(0.12)
    # 3 workers on 2 cores (10, 10, 30): all three compute at 1.5x co-located (0.135 s for a batch of 10,
    # 0.27 s for 30) until the two small ones are done at 0.135 s, with half of the large one's work done;
    # the other half alone (0.06 s): 0.195 s
    three = sim.simulate([MachineGroup(local, 2, 10), MachineGroup(local, 1, 30)])
    assert three.forward_s + three.backward_s == pytest.approx(0.195)
    # bounds still hold: no pass below the smaller of alone and co-located
    assert sim.device_stats(local, 30)[0] <= mixed.forward_s


def test_contention_splits_each_workers_work_by_how_many_computed_with_it():
    from thrifty.perfmodels.simulator import _contention

    # group 0: 2 workers needing 1 s each at any level; group 1: 1 worker needing 2 s with 3 computing, 1 s alone
    mix = _contention({0: 2, 1: 1}, lambda j, m: 1.0 if j == 0 else (2.0 if m == 3 else 1.0))
    assert mix[0] == pytest.approx({3: 1.0})
    assert mix[1] == pytest.approx({3: 0.5, 1: 0.5})
    assert sum(mix[1].values()) == pytest.approx(1.0)


def test_ddp_forward_waits_for_the_buffer_broadcast():
    data = profile_dict(device="gpu", layers=((1000, 1.0),))
    plain = ComputeModel.from_profile(ComputeProfile.model_validate(data))
    buffered = ComputeModel.from_profile(ComputeProfile.model_validate({**data, "buffer_bytes": 500_000}))
    g = instance("g", device="gpu")
    a = _sim([plain], FixedBandwidth(1e8, 1e9), transfer="ddp").simulate([MachineGroup(g, 2, 10)])
    b = _sim([buffered], FixedBandwidth(1e8, 1e9), transfer="ddp").simulate([MachineGroup(g, 2, 10)])
    # 500 kB on 2 workers at 1e8 B/s bus bandwidth: an allreduce takes 2 * 5e5 * 1/2 / 1e8 = 5 ms, and a
    # broadcast (one pass around the ring, not two) half of it, before the forward pass
    assert b.forward_s - a.forward_s == pytest.approx(0.0025)
    assert b.mean_s - a.mean_s == pytest.approx(0.0025)


def test_ddp_overhead_adds_to_the_exposed_communication():
    data = profile_dict(device="gpu", layers=((1000, 1.0),))
    overhead = ComputeModel.from_profile(ComputeProfile.model_validate({**data, "ddp_overhead_s": 0.003}))
    g = instance("g", device="gpu")
    ddp = _sim([overhead], FixedBandwidth(1e12, 1e12), transfer="ddp")
    one, two = ddp.simulate([MachineGroup(g, 1, 10)]), ddp.simulate([MachineGroup(g, 2, 10)])
    # DDP wraps a world of one too: the overhead is there without communication
    assert one.exposed_comm_s == pytest.approx(0.003, rel=1e-9)
    assert two.mean_s - one.mean_s == pytest.approx(0.0, abs=1e-6)  # 2 kB at 1e12 B/s: the overhead is all
    assert two.exposed_comm_s == pytest.approx(0.003, rel=1e-3)
    # the per-layer queue is Srifty's, without DDP's buckets
    layer = _sim([overhead], FixedBandwidth(1e12, 1e12), transfer="layer").simulate([MachineGroup(g, 2, 10)])
    assert layer.exposed_comm_s == pytest.approx(0.0, abs=1e-6)


def test_host_worker_types_of_any_name_share_the_host_and_its_probes():
    """The demo's priced `local-a` and `local-b` are worker processes of this
    host, as `local` is: the shipped probes answer their allreduce, and all
    of them together share the host's cores."""
    from pathlib import Path

    from thrifty.datasets.catalog import load_catalog
    from thrifty.perfmodels.loading import default_bandwidth_model

    demo = load_catalog(Path(__file__).resolve().parents[1] / "datasets" / "examples" / "local-demo-catalog.json")
    a, b, local = demo.get("local-a"), demo.get("local-b"), load_catalog().get("local")
    assert a.host_worker and b.host_worker and local.host_worker and not load_catalog().get("g4dn.8xlarge").host_worker
    bandwidth = default_bandwidth_model()
    assert bandwidth.source(a) == bandwidth.source(b) == "learned"
    sim = IterationSimulator("tiny-transformer", bandwidth=bandwidth)
    assert sim.simulate([MachineGroup(a, 2, 16)]).mean_s == pytest.approx(
        sim.simulate([MachineGroup(local, 2, 16)]).mean_s, rel=1e-9)
    # four workers of two names on this 2-core host are as slow as four `local` ones
    mixed = sim.simulate([MachineGroup(a, 2, 16), MachineGroup(b, 2, 16)]).mean_s
    assert mixed == pytest.approx(sim.simulate([MachineGroup(local, 4, 16)]).mean_s, rel=0.01)
    assert mixed > 1.5 * sim.simulate([MachineGroup(a, 2, 16)]).mean_s
