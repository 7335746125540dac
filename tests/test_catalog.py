"""The shipped AWS instance catalog and its loader: contents, error messages,
and that the committed build script reproduces the shipped file. The file
format is the schema `CatalogFile`: every shipped catalog loads and dumps to
the same data, and a bad field is named by its JSON path (also through the
CLI, exit 2)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

import thrifty.datasets as ds
from thrifty.datasets import load_catalog
from thrifty.core import ProblemError
from thrifty.datasets.catalog import parse_catalog_file
from thrifty.runtime.cli import main

from helpers import load_script

SHIPPED = Path(ds.__file__).parent / "catalog" / "aws-us-east-1.json"
BUILD_SCRIPT = Path(ds.__file__).parent / "scripts" / "build_catalog.py"
SHIPPED_CATALOGS = [SHIPPED, SHIPPED.parent / "srifty-2022.json",
                    Path(ds.__file__).parent / "examples" / "local-demo-catalog.json"]
KNOWN_DEVICES = {"V100", "M60", "T4", "A10G", "L4", "A100", "H100", "cpu"}
REQUIRED_TYPES = [
    "local",
    "p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p3dn.24xlarge",
    "g3.4xlarge", "g3.8xlarge", "g3.16xlarge",
    *[f"g4dn.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge")],
    *[f"g5.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")],
    *[f"g6.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")],
    "p4d.24xlarge", "p5.48xlarge",
]


def shipped_json() -> dict:
    return json.loads(SHIPPED.read_text(encoding="utf-8"))


def write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


# --- the shipped catalog ---------------------------------------------------------------


def test_shipped_catalog_loads_by_default():
    cat = load_catalog()
    assert cat.provider == "aws" and cat.region == "us-east-1"
    assert Path(cat.source) == SHIPPED
    for name in REQUIRED_TYPES:
        assert name in cat, name


def test_provenance_names_script_inputs_and_date():
    prov = load_catalog().provenance
    assert prov["kind"] in ("published", "derived")
    assert prov["script"] == "datasets/scripts/build_catalog.py"
    assert prov["date"] and prov["inputs"]


@pytest.mark.parametrize("name", REQUIRED_TYPES)
def test_every_type_is_usable(name):
    t = load_catalog().get(name)
    assert t.gpus >= 1
    assert t.network_gbps > 0
    assert t.device in KNOWN_DEVICES
    assert t.on_demand_usd_per_hour is not None and t.on_demand_usd_per_hour >= 0
    assert t.price_date and t.price_source
    if t.device != "cpu":
        assert t.on_demand_usd_per_hour > 0
        assert t.gpu_memory_gib > 0 and t.vcpus > 0 and t.memory_gib > 0
        assert t.interconnect_gbps is not None and t.interconnect_gbps > 0
        if t.spot_usd_per_hour is not None:
            assert 0 < t.spot_usd_per_hour < t.on_demand_usd_per_hour


def test_spot_price_missing_only_where_documented():
    rows = {r["name"]: r for r in shipped_json()["instance_types"]}
    for name, t in load_catalog().types.items():
        if t.spot_usd_per_hour is None:
            assert rows[name].get("notes"), f"{name} has no spot price and no note saying why"


def test_every_row_lists_rating_and_interconnect_fields():
    for row in shipped_json()["instance_types"]:
        for key in ("gpu_model", "network_rating", "interconnect_gbps", "price_date", "price_source"):
            assert key in row, (row["name"], key)


def test_up_to_ratings_use_the_burst_figure():
    rows = {r["name"]: r for r in shipped_json()["instance_types"]}
    assert rows["g5.xlarge"]["network_rating"] == "Up to 10 Gigabit"
    assert load_catalog().get("g5.xlarge").network_gbps == 10.0
    assert load_catalog().get("p4d.24xlarge").network_gbps == 400.0  # "4x 100 Gigabit"


def test_known_hardware_facts():
    cat = load_catalog()
    p38 = cat.get("p3.8xlarge")
    assert (p38.gpus, p38.device, p38.gpu_memory_gib, p38.vcpus) == (4, "V100", 16.0, 32)
    assert p38.on_demand_usd_per_hour == 12.24
    assert cat.get("p3.16xlarge").gpus == 8
    assert cat.get("g3.8xlarge").gpus == 2 and cat.get("g3.8xlarge").device == "M60"
    assert cat.get("g4dn.12xlarge").gpus == 4 and cat.get("g4dn.12xlarge").device == "T4"
    assert cat.get("g5.48xlarge").gpus == 8 and cat.get("g6.48xlarge").device == "L4"
    assert cat.get("p4d.24xlarge").device == "A100" and cat.get("p5.48xlarge").device == "H100"
    # NVLink/NVSwitch machines move data between their GPUs faster than PCIe ones
    assert cat.get("p3.8xlarge").interconnect_gbps > cat.get("g4dn.12xlarge").interconnect_gbps
    assert cat.get("p5.48xlarge").interconnect_gbps > cat.get("p4d.24xlarge").interconnect_gbps


def test_local_type_is_one_free_cpu_worker():
    t = load_catalog().get("local")
    assert (t.gpus, t.device) == (1, "cpu")
    assert t.price("on_demand") == 0 and t.price("spot") == 0
    assert t.network_gbps > 0


# --- error messages --------------------------------------------------------------------


def test_unknown_type_suggests_close_names():
    with pytest.raises(ProblemError) as e:
        load_catalog().get("p3.8xlrage")
    msg = str(e.value)
    assert "p3.8xlrage" in msg and "p3.8xlarge" in msg
    assert str(SHIPPED) in msg


def test_missing_field_names_file_and_row(tmp_path):
    data = shipped_json()
    del data["instance_types"][3]["network_gbps"]
    path = write(tmp_path / "missing.json", data)
    with pytest.raises(ProblemError) as e:
        load_catalog(path)
    msg = str(e.value)
    assert str(path) in msg and "network_gbps" in msg and "instance_types[3]" in msg


def test_wrong_format_names_file(tmp_path):
    data = shipped_json()
    data["format"] = "thrifty.catalog/0"
    path = write(tmp_path / "old.json", data)
    with pytest.raises(ProblemError) as e:
        load_catalog(path)
    assert str(path) in str(e.value) and "thrifty.catalog/1" in str(e.value)


def test_malformed_field_names_file(tmp_path):
    data = shipped_json()
    data["instance_types"][1]["gpus"] = "four"
    path = write(tmp_path / "bad.json", data)
    with pytest.raises(ProblemError) as e:
        load_catalog(path)
    assert str(path) in str(e.value)


def test_unknown_market_and_missing_spot_price(tmp_path):
    data = shipped_json()
    row = copy.deepcopy(data["instance_types"][1])
    row["name"], row["spot_usd_per_hour"] = "x.nospot", None
    data["instance_types"] = [row]
    cat = load_catalog(write(tmp_path / "nospot.json", data))
    with pytest.raises(ProblemError, match="no spot price for x.nospot"):
        cat.get("x.nospot").price("spot")
    with pytest.raises(ProblemError, match="market"):
        cat.get("x.nospot").price("reserved")


@pytest.mark.parametrize("path", SHIPPED_CATALOGS, ids=lambda p: p.name)
def test_every_shipped_catalog_round_trips_through_its_schema(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    assert parse_catalog_file(data, str(path)).to_json() == data


@pytest.mark.parametrize("row,key,value,message", [
    (1, "gpus", 0, "is 0, but must be greater than 0"),
    (2, "network_gbps", -10.0, "is -10, but must be greater than 0"),
    (0, "on_demand_usd_per_hour", "free", "input should be a valid number"),
    (3, "spot_usd_per_hour", -1.0, "is -1, but must be at least 0"),
    (4, "interconnect_gbps", float("inf"), "is inf, but must be a finite number"),
    (5, "device", "", "string should have at least 1 character"),
    (6, "spot_usd_per_hr", 0.5, "is not a known field"),
    (7, "name", "p3.2xlarge", "is 'p3.2xlarge', which instance_types[1] already names"),
])
def test_a_bad_field_of_a_row_is_named_by_its_path(row, key, value, message):
    data = shipped_json()
    data["instance_types"][row][key] = value
    with pytest.raises(ProblemError) as e:
        parse_catalog_file(data, "bad.json")
    assert (e.value.source, e.value.path) == ("bad.json", f"instance_types[{row}].{key}")
    assert e.value.message.startswith(message), e.value.message


@pytest.mark.parametrize("key,value,path,message", [
    ("format", "thrifty.catalog/0", "format", "input should be 'thrifty.catalog/1'"),
    ("provenance", {"kind": "derived"}, "provenance", "a catalog must say where it came from"),
    ("instance_types", [], "instance_types", "list should have at least 1 item"),
    ("provider", None, "provider", "input should be a valid string"),
])
def test_a_bad_top_level_field_is_named_by_its_path(key, value, path, message):
    data = shipped_json()
    data[key] = value
    with pytest.raises(ProblemError) as e:
        parse_catalog_file(data, "bad.json")
    assert e.value.path == path
    assert e.value.message.startswith(message), e.value.message


def test_unknown_host_figures_read_as_zero():
    data = shipped_json()
    row = data["instance_types"][0]
    row["gpu_memory_gib"] = row["vcpus"] = row["memory_gib"] = None
    t = parse_catalog_file(data, "nulls.json").instance_types[0]
    assert (t.gpu_memory_gib, t.vcpus, t.memory_gib) == (0.0, 0, 0.0)


def test_cli_names_the_bad_field_of_a_catalog_and_exits_2(tmp_path, capsys):
    data = shipped_json()
    data["instance_types"][2]["gpus"] = "four"
    path = write(tmp_path / "bad-catalog.json", data)
    assert main(["simulate", "--model", "resnet50", "--config", "p3.8xlarge@64", "--catalog", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: instance_types[2].gpus: input should be a valid integer" in err
    assert "Traceback" not in err


# --- the build script ------------------------------------------------------------------


def _build_module():
    return load_script(BUILD_SCRIPT)


def test_build_script_reproduces_shipped_catalog(tmp_path):
    pytest.importorskip("moto")
    mod = _build_module()
    out = tmp_path / "aws-us-east-1.json"
    assert mod.main(["--out", str(out)]) == 0
    rebuilt = json.loads(out.read_text(encoding="utf-8"))
    assert mod.comparable(rebuilt) == mod.comparable(shipped_json()), (
        "the shipped catalog differs from a fresh build; regenerate it with "
        "python datasets/scripts/build_catalog.py"
    )
    assert load_catalog(out).get("p3.8xlarge").gpus == 4


def test_build_script_check_mode(tmp_path, capsys):
    pytest.importorskip("moto")
    mod = _build_module()
    assert mod.main(["--check", "--out", str(SHIPPED)]) == 0
    data = shipped_json()
    data["instance_types"][1]["on_demand_usd_per_hour"] = 1.0
    stale = write(tmp_path / "stale.json", data)
    assert mod.main(["--check", "--out", str(stale)]) == 1


@pytest.mark.parametrize("rating,gbps", [
    ("Up to 10 Gigabit", 10.0), ("25 Gigabit", 25.0), ("4x 100 Gigabit", 400.0), ("3200 Gigabit", 3200.0),
])
def test_network_rating_parser(rating, gbps):
    assert _build_module().parse_network_rating(rating) == gbps


def test_network_rating_parser_rejects_unknown_wording():
    with pytest.raises(ValueError):
        _build_module().parse_network_rating("High")
