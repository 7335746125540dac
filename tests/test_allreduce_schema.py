"""The two file formats of the learned allreduce model, each owned by its schema:
a saved model (``thrifty.allreduce_model/1``, `AllreduceModelFile`) and the
probe rows it is fitted on (`ProbeRow`, one row of a probe CSV).

A bad field is named by its JSON path (a model) or by its row, CSV line and
column (probes), with the rule it breaks; the shipped files load and write
back unchanged; ``thrifty schema allreduce-model`` and ``thrifty schema
probe-rows`` print JSON Schemas that name the fields."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from thrifty.datasets import InstanceType

from thrifty.core import ProblemError
from thrifty.perfmodels.allreduce import (
    MODEL_FORMAT,
    PROBE_COLUMNS,
    AllreduceModelFile,
    Hyperparams,
    LearnedAllreduce,
    fit_allreduce,
    ProbeRow,
    load_allreduce_model,
    load_probes,
    parse_probe_rows,
)
from thrifty.perfmodels.bandwidth import bus_bandwidth_from_time
from thrifty.perfmodels.loading import SHIPPED_LOCAL_MODEL
from thrifty.runtime.cli import main

SHIPPED_PROBES = SHIPPED_LOCAL_MODEL.parent / "local-gloo-probes.csv"
LOCAL = InstanceType(name="local", gpus=1, device="cpu", gpu_memory_gib=0.0, vcpus=1, memory_gib=1.0,
                     network_gbps=10.0, on_demand_usd_per_hour=0.0, spot_usd_per_hour=None)
ONE_POINT_GRID = (Hyperparams(3, 30, 0.3, "reg:squarederror", "log_time"),)


@pytest.fixture(scope="module")
def shipped() -> dict[str, Any]:
    return json.loads(SHIPPED_LOCAL_MODEL.read_text())


def _changed(data: dict[str, Any], loc: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A deep copy of `data` with the field at `loc` set to `value` (deleted if `value` is `DELETE`)."""
    out = copy.deepcopy(data)
    *parents, last = loc
    inner = out
    for key in parents:
        inner = inner[key]
    if value is DELETE:
        del inner[last]
    else:
        inner[last] = value
    return out


DELETE = object()


# -- the saved model: shipped file, round trip ------------------------------------------------


def test_the_shipped_model_loads_and_writes_back_unchanged(shipped, tmp_path):
    model = load_allreduce_model(SHIPPED_LOCAL_MODEL)
    assert model.to_json() == shipped  # the file's content, boosters included
    model.save(tmp_path / "again.json")
    text = (tmp_path / "again.json").read_text()
    import xgboost

    if shipped["training"]["xgboost"] == xgboost.__version__:  # the boosters' text is xgboost's own
        assert text == SHIPPED_LOCAL_MODEL.read_text()
    again = load_allreduce_model(tmp_path / "again.json")
    again.save(tmp_path / "third.json")
    assert (tmp_path / "third.json").read_text() == text
    sizes = np.geomspace(4, 2**28, 40)
    for n in (2, 3, 4):
        np.testing.assert_array_equal(again.bus_bandwidth(LOCAL, sizes, n, n), model.bus_bandwidth(LOCAL, sizes, n, n))


def _rows() -> list[dict[str, Any]]:
    rows = []
    for n in (2, 3):
        for i, size in enumerate(4 * 4**k for k in range(11)):
            for k in (1, 2):
                seconds = 2 * (n - 1) * 20e-6 + k * 2 * (n - 1) / n * size / 2e9
                rows.append({"timestamp": f"2025-01-0{i % 3 + 1}T00:00:00Z", "instance_type": "synth",
                             "device": "cpu", "backend": "gloo", "rated_network_gbps": 10.0,
                             "gpus_per_instance": 1, "instances": n, "world_size": n, "buffer_bytes": size,
                             "concurrent": k, "repeat": 0, "seconds": seconds,
                             "busbw_bytes_per_s": float(bus_bandwidth_from_time(size, n, seconds))})
    return rows


@pytest.fixture(scope="module")
def fitted() -> LearnedAllreduce:
    provenance = {"kind": "derived", "script": "thrifty fit-allreduce p.csv --out m.json",
                  "inputs": [{"path": "p.csv", "digest": "sha256:" + "ab" * 32}], "date": "2026-11-24"}
    return fit_allreduce(_rows(), grid=ONE_POINT_GRID, half_life_days=3.5, provenance=provenance)


def test_a_fitted_model_round_trips_through_its_schema(fitted, tmp_path):
    data = fitted.to_json()
    assert json.loads(json.dumps(data)) == data  # plain JSON
    assert AllreduceModelFile.model_validate(data).to_json() == data
    fitted.save(tmp_path / "m.json")
    loaded = LearnedAllreduce.load(tmp_path / "m.json")
    assert loaded.to_json() == data
    assert (loaded.fit_report, loaded.coverage, loaded.training, loaded.provenance, loaded.mtu_bytes) == (
        fitted.fit_report, fitted.coverage, fitted.training, fitted.provenance, fitted.mtu_bytes)
    synth = dataclasses.replace(LOCAL, name="synth")
    sizes = np.geomspace(1, 2**26, 50)
    for n, k in ((2, 1), (3, 2), (8, 1)):
        np.testing.assert_array_equal(loaded.bus_bandwidth(synth, sizes, n, n, concurrent=k),
                                      fitted.bus_bandwidth(synth, sizes, n, n, concurrent=k))
        assert loaded.bandwidth_cap(synth, n, n) == fitted.bandwidth_cap(synth, n, n)


def test_a_model_without_provenance_or_training_keys_still_loads(shipped):
    data = _changed(_changed(shipped, ("provenance",), DELETE), ("training",), DELETE)
    data = _changed(_changed(data, ("features", "columns"), DELETE), ("mtu_bytes",), DELETE)
    model = LearnedAllreduce.from_json(data, source="old.json")
    assert model.provenance == {} and model.training == {} and model.mtu_bytes == 9001


# -- the saved model: a bad field is named by its JSON path ------------------------------------


@pytest.mark.parametrize("loc,value,path,message", [
    (("format",), "thrifty.catalog/1", "format", "input should be 'thrifty.allreduce_model/1'"),
    (("mtu_bytes",), 0, "mtu_bytes", "is 0, but must be at least 1"),
    (("colour",), "blue", "colour", "is not a known field"),
    (("features", "numeric"), ["log2_buffer_bytes"], "features.numeric",
     "is ['log2_buffer_bytes'], but this thrifty uses ['log2_buffer_bytes', 'world_size'"),
    (("features", "columns", 7), "instance_type=other", "features.columns", "is ['log2_buffer_bytes'"),
    (("instance_types", "local", "buffer_bytes", 3), 16, "instance_types.local.buffer_bytes[3]",
     "is 16, but must be larger than the one before (16)"),
    (("instance_types", "local", "world_sizes", 0), 1, "instance_types.local.world_sizes[0]",
     "is 1, but must be at least 2"),
    (("instance_types", "local", "rated_network_gbps"), "fast", "instance_types.local.rated_network_gbps",
     "input should be a valid number"),
    (("instance_types", "local", "device"), "V100", "instance_types.local.device",
     "is 'V100', but must be one of features.devices ['cpu']"),
    (("instance_types", "local", "last_probe"), "yesterday", "instance_types.local.last_probe",
     "is 'yesterday', but must be an ISO 8601 time"),
    (("instance_types", "local", "rows"), DELETE, "instance_types.local.rows", "is required but missing"),
    (("caps", 1, "b_cap_bytes_per_s"), -1.0, "caps[1].b_cap_bytes_per_s", "is -1, but must be greater than 0"),
    (("caps", 0, "instance_type"), "p3.8xlarge", "caps[0].instance_type",
     "is 'p3.8xlarge', but must be a probed type"),
    (("training", "half_life_days"), 0, "training.half_life_days", "is 0, but must be greater than 0"),
    (("provenance", "script"), DELETE, "provenance.script", "is required: a derived model must say its script"),
    (("provenance", "inputs", 0, "digest"), "md5:0", "provenance.inputs[0].digest", "string should match pattern"),
    (("submodels", "large"), DELETE, "submodels.large", "is required but missing"),
    (("submodels", "large", "target", "form"), "sqrt", "submodels.large.target.form",
     "input should be 'busbw', 'log_busbw' or 'log_time'"),
    (("submodels", "small", "target", "scale"), 0.0, "submodels.small.target.scale",
     "is 0, but must be greater than 0"),
    (("submodels", "small", "report", "hyperparams", "n_estimators"), 0,
     "submodels.small.report.hyperparams.n_estimators", "is 0, but must be at least 1"),
    (("submodels", "small", "report", "cv_mape"), math.nan, "submodels.small.report.cv_mape",
     "is nan, but must be a finite number"),
    (("submodels", "small", "booster"), "trees", "submodels.small.booster", "input should be a valid dictionary"),
])
def test_a_bad_field_of_a_saved_model_is_named_by_its_path(shipped, loc, value, path, message):
    with pytest.raises(ProblemError) as e:
        LearnedAllreduce.from_json(_changed(shipped, loc, value), source="m.json")
    assert (e.value.source, e.value.path) == ("m.json", path)
    assert e.value.message.startswith(message), e.value.message
    assert str(e.value).startswith(f"m.json: {path}: ")


def test_a_probed_type_without_its_feature_column_is_named_by_its_key(shipped):
    data = copy.deepcopy(shipped)
    data["instance_types"]["p3.8xlarge"] = data["instance_types"]["local"]
    with pytest.raises(ProblemError) as e:
        LearnedAllreduce.from_json(data, source="m.json")
    assert e.value.path == 'instance_types["p3.8xlarge"]'
    assert "is not one of features.instance_types ['local']" in e.value.message


def test_a_booster_that_is_not_an_xgboost_tree_model_is_named(shipped):
    with pytest.raises(ProblemError) as e:
        LearnedAllreduce.from_json(_changed(shipped, ("submodels", "small", "booster", "learner"), {}), "m.json")
    assert e.value.path == "submodels.small.booster"
    assert e.value.message == ("is not an xgboost tree model thrifty can evaluate: "
                               "learner.learner_model_param is missing")
    # a feature column more than the boosters read: every prediction would fail
    data = _changed(_changed(shipped, ("features", "devices"), ["cpu", "gpu"]), ("features", "columns"), DELETE)
    with pytest.raises(ProblemError) as e:
        LearnedAllreduce.from_json(data, "m.json")
    assert e.value.path == "submodels.small.booster"
    assert e.value.message.startswith("reads 8 features, but the model's features are 9 columns")


def test_a_model_that_would_not_load_is_not_saved(fitted, tmp_path):
    broken = copy.copy(fitted)
    broken.provenance = {"kind": "derived"}
    with pytest.raises(ProblemError, match=r"the allreduce model of synth: provenance\.script: is required"):
        broken.save(tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


def test_fit_checks_the_provenance_before_fitting():
    with pytest.raises(ProblemError) as e:
        fit_allreduce(_rows(), grid=ONE_POINT_GRID, provenance={"kind": "derived", "script": "x",
                                                                      "inputs": ["p.csv"]})
    assert e.value.path == "provenance.inputs[0]"


def test_cli_names_the_bad_field_of_an_allreduce_model_and_exits_2(shipped, tmp_path, capsys):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(_changed(shipped, ("instance_types", "local", "max_concurrent"), 0)))
    assert main(["simulate", "--model", "resnet50", "--config", "2xp3.8xlarge@256", "--allreduce", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: instance_types.local.max_concurrent: is 0, but must be at least 1" in err
    assert "Traceback" not in err


# -- probe rows: a bad cell is named by its row, line and column -------------------------------


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...] = PROBE_COLUMNS) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    return path


@pytest.mark.parametrize("row,column,value,message", [
    (1, "timestamp", "yesterday", "is 'yesterday', but must be an ISO 8601 time (2025-01-31T12:00:00Z)"),
    (2, "instance_type", " ", "is empty, but must be a name"),
    (3, "rated_network_gbps", "-1", "is '-1', but must be at least 0"),
    (4, "gpus_per_instance", "0", "is '0', but must be at least 1"),
    (5, "world_size", "two", "input should be a valid integer"),
    (6, "buffer_bytes", "2.5", "input should be a valid integer"),
    (7, "concurrent", "", "is empty, but must be an integer"),
    (8, "repeat", "-1", "is '-1', but must be at least 0"),
    (9, "seconds", "inf", "is 'inf', but must be a finite number"),
    (10, "busbw_bytes_per_s", "0", "is '0', but must be greater than 0"),
    (11, "instances", "3", "is 3, larger than world_size 2"),
    (12, "busbw_bytes_per_s", "1000.0", "is 1000.0, but 2 s (n-1) / (n t) from buffer_bytes, world_size and"),
])
def test_a_bad_cell_of_a_probe_csv_is_named_by_row_line_and_column(tmp_path, row, column, value, message):
    rows = _rows()
    rows[row - 1][column] = value
    path = _write_csv(tmp_path / "probes.csv", rows)
    with pytest.raises(ProblemError) as e:
        load_probes(path)
    assert (e.value.source, e.value.path) == (str(path), f"row {row} (line {row + 1}), field '{column}'")
    assert e.value.message.startswith(message), e.value.message


def test_a_row_shorter_than_the_header_is_named(tmp_path):
    path = _write_csv(tmp_path / "probes.csv", _rows())
    lines = path.read_text().splitlines()
    lines[2] = lines[2].rsplit(",", 1)[0]  # row 2 lost its last cell
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProblemError, match=r"row 2 \(line 3\), field 'busbw_bytes_per_s': is empty, but must be a num"):
        load_probes(path)


@pytest.mark.parametrize("column,value,message", [
    ("world_size", True, "is True, but must be an integer"),
    ("seconds", None, "is empty, but must be a number"),
    ("device", "", "is empty, but must be a name"),
    ("buffer_bytes", 1.5, "input should be a valid integer, got a number with a fractional part"),
])
def test_a_bad_value_of_a_row_mapping_is_named_by_row_and_column(column, value, message):
    rows = _rows()
    rows[4][column] = value
    with pytest.raises(ProblemError) as e:
        parse_probe_rows(rows, source="probe output")
    assert (e.value.source, e.value.path) == ("probe output", f"row 5, field '{column}'")
    assert e.value.message.startswith(message), e.value.message


def test_a_missing_key_of_a_row_mapping_is_named():
    rows = _rows()
    del rows[1]["seconds"]
    with pytest.raises(ProblemError, match=r"probe rows: row 2, field 'seconds': is required but missing"):
        parse_probe_rows(rows)


def test_probe_rows_read_their_columns_as_typed_values(tmp_path):
    rows = _rows()
    rows[0]["timestamp"] = "2025-01-01T01:00:00"  # no zone: UTC
    for row in rows:
        row["host"] = "extra column, ignored"
    from_csv = load_probes(_write_csv(tmp_path / "p.csv", rows, PROBE_COLUMNS + ("host",)))
    from_rows = parse_probe_rows(rows)
    for table in (from_csv, from_rows):
        assert table.timestamp[0] == 1735693200.0  # 2025-01-01T01:00:00Z
        assert table.world_size.dtype == np.int64 and table.seconds.dtype == float
        assert list(table.buffer_bytes) == [r["buffer_bytes"] for r in rows]
        assert list(table.busbw) == [r["busbw_bytes_per_s"] for r in rows]  # floats read back exactly


def test_the_shipped_probes_load_and_every_row_fits_the_schema():
    table = load_probes(SHIPPED_PROBES)
    assert len(table) == 6000 and set(table.instance_type) == {"local"}
    with SHIPPED_PROBES.open() as f:
        first = next(csv.DictReader(f))
    assert ProbeRow.model_validate(first).world_size == 2


# -- thrifty schema allreduce-model | probe-rows ------------------------------------------------


def _schema(kind: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(["schema", kind]) == 0
    return json.loads(capsys.readouterr().out)


def test_schema_allreduce_model_names_the_fields_and_accepts_the_shipped_model(shipped, capsys):
    schema = _schema("allreduce-model", capsys)
    assert schema["title"] == "AllreduceModelFile" and schema["additionalProperties"] is False
    assert list(schema["properties"]) == ["format", "mtu_bytes", "min_bus_bandwidth_bytes_per_s", "features",
                                          "instance_types", "caps", "training", "provenance", "submodels"]
    assert schema["properties"]["format"]["const"] == MODEL_FORMAT
    defs = schema["$defs"]
    assert {"world_sizes", "buffer_bytes", "max_concurrent"} <= set(defs["TypeCoverageFile"]["properties"])
    assert defs["TypeCoverageFile"]["properties"]["buffer_bytes"]["items"]["minimum"] == 1
    assert defs["TargetFile"]["properties"]["form"]["enum"] == ["busbw", "log_busbw", "log_time"]
    assert {"small", "large"} == set(defs["SubmodelsFile"]["required"])
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the ray extra ([all])")
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert not list(validator.iter_errors(shipped))
    bad = _changed(shipped, ("caps", 0, "b_cap_bytes_per_s"), -1.0)
    assert [list(e.absolute_path) for e in validator.iter_errors(bad)] == [["caps", 0, "b_cap_bytes_per_s"]]


def test_schema_probe_rows_names_the_columns_in_file_order(capsys):
    schema = _schema("probe-rows", capsys)
    assert schema["title"] == "ProbeRow"
    assert tuple(schema["properties"]) == PROBE_COLUMNS == tuple(schema["required"])
    world_size = schema["properties"]["world_size"]
    assert (world_size["type"], world_size["minimum"], world_size["description"]) == (
        "integer", 2, "workers in the allreduce")
    assert schema["properties"]["seconds"]["exclusiveMinimum"] == 0
    assert schema["properties"]["timestamp"]["format"] == "date-time"
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with the ray extra ([all])")
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    row = _rows()[0]
    assert not list(validator.iter_errors(row))
    assert [list(e.absolute_path) for e in validator.iter_errors({**row, "seconds": 0.0})] == [["seconds"]]
