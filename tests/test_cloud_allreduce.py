"""The derived allreduce model of cloud GPU types (issue 18): its file is what
its script writes, its answers obey what any allreduce over real links obeys
(bus bandwidth grows with the buffer up to its cap, no ring across machines is
faster than the network it crosses, NVLink beats the network, more machines
cost small buffers time), it is wired between the learned local model and the
analytic ring, and a bad file is bad input that names the JSON path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from thrifty.datasets.catalog import InstanceType, load_catalog
from thrifty.core.errors import ProblemError
from thrifty.perfmodels.allreduce.derived import DerivedCloudAllreduce, load_cloud_allreduce_model
from thrifty.perfmodels.bandwidth import AnalyticAllreduce
from thrifty.perfmodels.cluster import MachineGroup
from thrifty.perfmodels.library import ModelLibrary
from thrifty.perfmodels.loading import SHIPPED_CLOUD_MODEL, SHIPPED_LOCAL_MODEL, default_bandwidth_model
from thrifty.perfmodels.loading import load_bandwidth_model
from thrifty.perfmodels.simulator import IterationSimulator
from thrifty.runtime.cli import main

from helpers import compute_model, instance, load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "datasets" / "scripts" / "derive_cloud_allreduce.py"
README = ROOT / "datasets" / "allreduce" / "README.md"
SIZES = np.array([4.0, 9001.0, 1e6, 25 * 2**20, 1e9])


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def model():
    return load_cloud_allreduce_model(SHIPPED_CLOUD_MODEL)


def shipped_data() -> dict:
    return json.loads(SHIPPED_CLOUD_MODEL.read_text(encoding="utf-8"))


def param(name: str) -> float:
    return shipped_data()["parameters"][name]["value"]


# -- the file and its script ---------------------------------------------------------------


def test_the_script_reproduces_the_shipped_file_byte_for_byte(tmp_path):
    out = tmp_path / "cloud.json"
    assert load_script(SCRIPT).main(["--out", str(out)]) == 0
    assert out.read_bytes() == SHIPPED_CLOUD_MODEL.read_bytes(), (
        "datasets/allreduce/cloud-derived-model.json is stale; run python datasets/scripts/derive_cloud_allreduce.py")


def test_the_readme_table_is_the_scripts():
    script = load_script(SCRIPT)
    assert script.markdown_table(shipped_data()) in README.read_text(encoding="utf-8"), (
        "the table in datasets/allreduce/README.md is stale; paste the output of "
        "python datasets/scripts/derive_cloud_allreduce.py --table")


def test_every_parameter_says_where_it_comes_from_and_the_file_is_derived():
    data = shipped_data()
    assert data["provenance"]["kind"] == "derived"
    assert (ROOT / data["provenance"]["script"]).is_file()
    for name, entry in data["parameters"].items():
        assert entry["basis"] in ("published", "measured", "derived", "assumed"), name
        assert entry["why"] and (entry.get("sources") or entry["basis"] == "assumed"), name
        assert entry["rows"], name
    assert data["parameters"]["tcp_efficiency"]["basis"] == "assumed"


# -- what its answers must obey, whatever its parameters ----------------------------------
# (The parameters are the module's; a test that recomputed its formulas from them would pass whatever
# the formulas said. These are properties of any allreduce over real links.)

RINGS = [(2, 2), (4, 4), (8, 8), (16, 16), (64, 64)]  # (world, instances): one GPU per machine
FINE_SIZES = np.geomspace(4, 4e9, 60)


def _answered(model, catalog) -> list[InstanceType]:
    return [t for t in catalog.types.values() if model.source(t) == "derived"]


def test_it_answers_every_gpu_type_of_the_catalog_that_has_its_figures(model, catalog):
    assert len(_answered(model, catalog)) >= 10


def test_bus_bandwidth_grows_with_the_buffer_up_to_the_cap_and_time_grows_too(model, catalog):
    for t in _answered(model, catalog):
        for machines, _ in RINGS:
            world, instances = machines * t.gpus, machines
            busbw = model.bus_bandwidth(t, FINE_SIZES, world, instances)
            cap = model.bandwidth_cap(t, world, instances)
            assert np.all(np.diff(busbw) >= 0), (t.name, machines)
            assert np.all(busbw <= cap * (1 + 1e-12)) and busbw[-1] >= 0.95 * cap, (t.name, machines)
            seconds = 2 * FINE_SIZES * (world - 1) / world / busbw
            assert np.all(np.diff(seconds) > 0), (t.name, machines)


def test_across_machines_no_ring_is_faster_than_the_network_it_crosses(model, catalog):
    """A ring's bus bandwidth across machines is what each link carries: at most the machine's rated
    network (bytes/s), and at most its sustained baseline where AWS publishes one."""
    for t in _answered(model, catalog):
        sustained = (t.network_baseline_gbps or t.network_gbps) * 1e9 / 8
        for machines, _ in RINGS:
            assert model.bandwidth_cap(t, machines * t.gpus, machines) <= sustained * (1 + 1e-12), t.name


def test_a_larger_ring_is_never_quicker_for_a_small_buffer(model, catalog):
    """Latency-bound buffers pay one step per machine of the ring: more machines, no less time."""
    for t in _answered(model, catalog):
        times = [2 * 4096 * (n - 1) / n / model.bus_bandwidth(t, np.array([4096.0]), n, n)[0] for n in (2, 8, 64)]
        assert times == sorted(times), (t.name, times)


def test_nvlink_inside_one_machine_beats_the_network_between_machines(model, catalog):
    for name in ("p3.8xlarge", "p3.16xlarge", "g5.12xlarge"):
        t = catalog.get(name)
        if t.interconnect_gbps and t.interconnect_gbps > t.network_gbps:
            assert model.bandwidth_cap(t, t.gpus, 1) > model.bandwidth_cap(t, 2 * t.gpus, 2), name


def test_a_burst_file_is_never_slower_than_a_baseline_one_and_faster_where_the_baseline_binds(catalog):
    data = shipped_data()
    data["parameters"]["network"]["value"] = "burst"
    burst, baseline = DerivedCloudAllreduce.from_json(data), load_cloud_allreduce_model(SHIPPED_CLOUD_MODEL)
    faster = 0
    for t in _answered(baseline, catalog):
        b, s = burst.bandwidth_cap(t, 2 * t.gpus, 2), baseline.bandwidth_cap(t, 2 * t.gpus, 2)
        assert b >= s, t.name
        faster += b > s
    assert faster >= 1  # the "Up to N Gigabit" types


def test_a_mixed_cluster_is_bounded_by_its_slowest_type_in_the_simulator(model, catalog):
    library = ModelLibrary(paths=[])
    library.add(compute_model(device="T4", layers=((10_000_000, 1.0),)))  # one 10 MB gradient, ready at the end
    sim = IterationSimulator("m", library=library, bandwidth=model, samples=16, transfer="layer")
    slow, fast = catalog.get("g4dn.2xlarge"), catalog.get("g4dn.8xlarge")
    backward = 0.02 + 0.002 * 10  # helpers.profile_dict at batch 10, no variance

    def exchange(t: InstanceType) -> float:  # one transfer of 10 MB on 2 workers: 1e7 bus bytes
        return backward + model.latency(t, 2, 2) + 1e7 / model.bandwidth_cap(t, 2, 2)

    mixed = sim.simulate([MachineGroup(slow, 1, 10), MachineGroup(fast, 1, 10)])
    assert mixed.exchange_s == pytest.approx(exchange(slow), rel=1e-9)
    assert mixed.bandwidth_sources == {"g4dn.2xlarge": "derived", "g4dn.8xlarge": "derived"}
    assert sim.simulate([MachineGroup(fast, 2, 10)]).exchange_s == pytest.approx(exchange(fast), rel=1e-9)
    assert exchange(fast) < exchange(slow)


# -- what it answers, and what it passes on -------------------------------------------------


def test_sources_of_answered_and_passed_on_types(model, catalog):
    for name in ("p3.8xlarge", "g3.8xlarge", "g4dn.8xlarge", "g5.12xlarge", "g6.xlarge"):
        assert model.source(catalog.get(name)) == "derived", name
    analytic = AnalyticAllreduce()
    no_interconnect = instance("x.multi", gpus=4, device="T4")  # several GPUs, no interconnect figure
    for t in (catalog.get("local"), catalog.get("p4d.24xlarge"), catalog.get("p5.48xlarge"),
              instance("c5.4xlarge", device="cpu"), no_interconnect):
        assert model.source(t) == "analytic", t.name
        np.testing.assert_array_equal(model.bus_bandwidth(t, SIZES, 8, 2), analytic.bus_bandwidth(t, SIZES, 8, 2))
        assert model.bandwidth_cap(t, 8, 2) == analytic.bandwidth_cap(t, 8, 2)


def test_default_model_chains_learned_derived_and_analytic(catalog):
    chain = default_bandwidth_model()
    cpu = instance("c5.4xlarge", device="cpu")
    assert chain.source(catalog.get("local")) == "learned"
    assert chain.source(catalog.get("g4dn.8xlarge")) == "derived"
    assert chain.source(cpu) == "analytic"
    derived = load_cloud_allreduce_model(SHIPPED_CLOUD_MODEL)
    g4dn = catalog.get("g4dn.8xlarge")
    np.testing.assert_array_equal(chain.bus_bandwidth(g4dn, SIZES, 4, 4), derived.bus_bandwidth(g4dn, SIZES, 4, 4))
    np.testing.assert_array_equal(chain.bus_bandwidth(cpu, SIZES, 4, 4),
                                  AnalyticAllreduce().bus_bandwidth(cpu, SIZES, 4, 4))


def test_a_measured_model_falls_back_to_the_derived_one(catalog):
    measured = load_bandwidth_model(SHIPPED_LOCAL_MODEL)  # what "allreduce": "model.json" loads
    assert measured.source(catalog.get("local")) == "learned"
    assert measured.source(catalog.get("p3.8xlarge")) == "derived"


def test_simulate_says_derived(capsys):
    assert main(["simulate", "--model", "resnet50", "--config", "2xg4dn.8xlarge@32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prediction"]["bandwidth_sources"] == {"g4dn.8xlarge": "derived"}


# -- the file format -------------------------------------------------------------------------


BAD_FILES = [
    (("parameters", "tcp_efficiency", "value"), 1.5,
     r"parameters\.tcp_efficiency\.value: is 1\.5, but must be at most 1"),
    (("parameters", "host_cap_gbytes_per_s", "value"), -4.7, r"parameters\.host_cap_gbytes_per_s\.value: is -4\.7"),
    (("parameters", "network", "value"), "peak", r"parameters\.network\.value"),
    (("parameters", "sockets_per_peer", "sources", 0), "nccl-999",
     r"parameters\.sockets_per_peer\.sources\[0\]: is 'nccl-999', which is not a key of sources"),
    (("parameters", "intra_efficiency", "colour"), "blue",
     r"parameters\.intra_efficiency\.colour: is not a known field"),
    (("provenance", "script"), None, r"provenance\.script: is required"),
    (("format",), "thrifty.allreduce_model/1", r"format: input should be 'thrifty\.cloud_allreduce_model/1'"),
]


@pytest.mark.parametrize("path,value,message", BAD_FILES, ids=[".".join(map(str, p)) for p, _, _ in BAD_FILES])
def test_a_bad_file_names_the_json_path(tmp_path, path, value, message):
    data = copy.deepcopy(shipped_data())
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad = tmp_path / "cloud.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ProblemError, match=message) as e:
        load_cloud_allreduce_model(bad)
    assert str(bad) in str(e.value)


def test_schema_command_prints_the_files_schema(capsys):
    assert main(["schema", "cloud-allreduce-model"]) == 0
    schema = json.loads(capsys.readouterr().out)
    top = schema["$defs"][schema["$ref"].rsplit("/", 1)[-1]] if "$ref" in schema else schema
    assert {"format", "parameters", "sources", "provenance"} <= set(top["properties"])
    assert top["additionalProperties"] is False
