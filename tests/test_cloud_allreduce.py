"""The derived allreduce model of cloud GPU types (issue 18): its file is what
its script writes, it computes the formulas of its module docstring from the
file's parameters, it is wired between the learned local model and the
analytic ring, and a bad file is bad input that names the JSON path."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from thrifty.datasets.catalog import InstanceType, load_catalog
from thrifty.datasets.errors import ProblemError
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


# -- the formulas --------------------------------------------------------------------------


def test_one_gpu_type_across_machines_is_the_ring_formula_of_the_files_parameters(model, catalog):
    g4dn = catalog.get("g4dn.2xlarge")  # 1 T4, "Up to 25", baseline 10 Gbit/s
    world = instances = 8
    beta = min(param("tcp_efficiency") * g4dn.network_baseline_gbps * 1e9 / 8, param("host_cap_gbytes_per_s") * 1e9)
    alpha = max(param("inter_latency_floor_s"), 2 * (world - 1) * param("inter_step_latency_s"))
    bus_bytes = 2 * SIZES * (world - 1) / world
    expected = bus_bytes / (alpha + bus_bytes / beta)
    np.testing.assert_allclose(model.bus_bandwidth(g4dn, SIZES, world, instances), expected, rtol=1e-12)
    assert model.bandwidth_cap(g4dn, world, instances) == pytest.approx(beta, rel=1e-12)
    assert beta == pytest.approx(1e9)  # 0.8 x 10 Gbit/s


def test_the_host_cap_bounds_a_fast_network(model, catalog):
    assert model.bandwidth_cap(catalog.get("g4dn.8xlarge"), 4, 4) == pytest.approx(
        param("host_cap_gbytes_per_s") * 1e9)  # 0.8 x 50 Gbit/s = 5 GB/s is above the 4.7 GB/s cap


def test_latency_grows_with_the_ring_past_its_floor(model, catalog):
    t = catalog.get("g4dn.8xlarge")
    assert model.latency(t, 2, 2) == pytest.approx(param("inter_latency_floor_s"))
    assert model.latency(t, 64, 64) == pytest.approx(2 * 63 * param("inter_step_latency_s"))


def test_inside_one_machine_the_interconnect_and_its_step_latency(model, catalog):
    p3 = catalog.get("p3.8xlarge")  # 4 V100 on NVLink
    beta = param("intra_efficiency") * p3.interconnect_gbps * 1e9 / 8
    assert model.bandwidth_cap(p3, 4, 1) == pytest.approx(beta)
    assert model.latency(p3, 4, 1) == pytest.approx(2 * 3 * param("intra_step_latency_s"))
    # across machines the slower of the network and the interconnect bounds the ring
    assert model.bandwidth_cap(p3, 8, 2) == pytest.approx(param("tcp_efficiency") * 10e9 / 8)


def test_up_to_types_use_their_baseline(model, catalog):
    for name, baseline in (("p3.2xlarge", 2.5), ("g3.4xlarge", 5.0), ("g4dn.xlarge", 5.0)):
        t = catalog.get(name)
        assert t.network_baseline_gbps == baseline and t.network_gbps > baseline, name
        assert model.bandwidth_cap(t, 2, 2) == pytest.approx(param("tcp_efficiency") * baseline * 1e9 / 8), name
    # a type without a published baseline is taken at its rating
    plain = instance("x.fixed", device="T4", network_gbps=10.0)
    assert model.bandwidth_cap(plain, 2, 2) == pytest.approx(param("tcp_efficiency") * 10e9 / 8)


def test_a_burst_file_uses_the_rating(tmp_path, catalog):
    data = shipped_data()
    data["parameters"]["network"]["value"] = "burst"
    burst = DerivedCloudAllreduce.from_json(data)
    t = catalog.get("g4dn.xlarge")
    assert burst.bandwidth_cap(t, 2, 2) == pytest.approx(param("tcp_efficiency") * t.network_gbps * 1e9 / 8)


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
