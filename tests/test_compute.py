import dataclasses
import json

import numpy as np
import pytest

from thrifty.core.errors import ProblemError
from thrifty.datasets.paths import profile_files
from thrifty.perfmodels.compute import ComputeModel, fit_piecewise_linear, load_compute_model
from thrifty.perfmodels.profile import ComputeProfile, load_profile, parse_profile, save_profile
from thrifty.runtime.cli import main

from helpers import compute_model, profile_dict


def _truth(x):
    # flat-ish latency-bound part up to 16, then throughput-bound slope, steeper past 128
    return 0.01 + 1e-5 * x + 4.9e-4 * np.maximum(0, x - 16) + 5e-4 * np.maximum(0, x - 128)


def test_piecewise_fit_recovers_known_segments():
    rng = np.random.default_rng(1)
    x = np.array([1, 2, 4, 8, 16, 24, 32, 64, 96, 128, 192, 256, 384, 512] * 4, dtype=float)
    y = _truth(x) * (1 + rng.normal(0, 0.005, len(x)))
    f = fit_piecewise_linear(x, y)
    assert f.knots == (16.0, 128.0)
    slopes = [seg[2] for seg in f.segments]
    assert slopes[1] == pytest.approx(5e-4, rel=0.05)
    assert slopes[2] == pytest.approx(1e-3, rel=0.05)
    grid = np.arange(1, 513)
    assert np.max(np.abs(f(grid) / _truth(grid) - 1)) < 0.03


def test_piecewise_fit_keeps_one_segment_for_linear_data():
    x = np.array([1, 2, 4, 8, 16, 32, 64, 128], dtype=float)
    f = fit_piecewise_linear(x, 0.002 + 0.001 * x)
    assert f.knots == ()
    assert f.slope == pytest.approx(0.001)
    assert f.intercept == pytest.approx(0.002)


def test_threshold_is_latency_to_throughput_transition():
    # t(B) = 0.03 + 0.003 B (forward + backward): half the asymptotic throughput at B = b/a = 10
    cm = compute_model(fw=(0.01, 0.001), bw=(0.02, 0.002), max_batch=4096,
                       batches=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096))
    # the best throughput within max_batch is 4096/(0.03+0.003*4096) ~ 0.9976/a, so the
    # threshold is the smallest B with B/(b + aB) >= 0.5 * that, i.e. just under b/a = 10
    assert cm.threshold_batch == 10


def test_sd_follows_profiled_coefficient_of_variation():
    cm = compute_model(cv=0.05)
    assert cm.forward_sd_s(32) == pytest.approx(0.05 * cm.forward_s(32), rel=1e-6)


def test_fitted_model_round_trips(tmp_path):
    cm = compute_model(cv=0.02, step_s=0.003)
    cm.save(tmp_path / "m.json")
    back = load_compute_model(tmp_path / "m.json")
    grid = np.array([1, 3, 17, 200])
    assert np.allclose(back.forward_s(grid), cm.forward_s(grid))
    assert np.allclose(back.backward_sd_s(grid), cm.backward_sd_s(grid))
    assert back.threshold_batch == cm.threshold_batch
    assert back.grad_bytes == cm.grad_bytes and back.step_s == cm.step_s


def test_profile_file_loads_as_compute_model(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_dict()))
    cm = load_compute_model(path)
    assert isinstance(cm, ComputeModel)
    assert cm.forward_s(10) == pytest.approx(0.02)


# -- bad input: one test per case -------------------------------------------------

def _write(tmp_path, data):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


def test_missing_field_names_field_and_file(tmp_path):
    data = profile_dict()
    del data["points"][1]["backward_s"]
    path = _write(tmp_path, data)
    with pytest.raises(ProblemError, match=r"bad\.json: points\[1\]\.backward_s: is required"):
        load_profile(path)


def test_negative_latency_is_rejected(tmp_path):
    data = profile_dict()
    data["points"][2]["forward_s"] = -0.1
    with pytest.raises(ProblemError, match=r"points\[2\]\.forward_s: .*greater than 0"):
        load_profile(_write(tmp_path, data))


def test_zero_latency_is_rejected(tmp_path):
    data = profile_dict()
    data["points"][0]["backward_s"] = 0
    with pytest.raises(ProblemError, match=r"points\[0\]\.backward_s"):
        load_profile(_write(tmp_path, data))


def test_nan_latency_is_rejected(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(profile_dict()).replace('"forward_s": 0.011', '"forward_s": NaN', 1))
    with pytest.raises(ProblemError, match=r"nan\.json: points\[0\]\.forward_s: .*finite"):
        load_profile(path)


def test_batch_beyond_memory_limit_is_rejected(tmp_path):
    data = profile_dict(max_batch=64)
    with pytest.raises(ProblemError, match=r"points\[7\]\.batch: batch 128 is beyond the memory limit max_batch 64"):
        load_profile(_write(tmp_path, data))


def test_malformed_json_names_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"model": ')
    with pytest.raises(ProblemError, match=r"broken\.json: not valid JSON"):
        load_profile(path)


def test_colocated_points_round_trip_and_are_checked(tmp_path):
    data = profile_dict(device="cpu")
    data["buffer_bytes"] = 1704
    data["colocated"] = {"workers": 2, "step_s": 0.001, "points": [
        {**p, "forward_s": 2 * p["forward_s"]} for p in data["points"]]}
    model = ComputeModel.from_profile(ComputeProfile.model_validate(data))
    assert model.colocated_workers == 2 and model.buffer_bytes == 1704
    assert model.colocated.forward_s(8) == pytest.approx(2 * model.forward_s(8))
    path = tmp_path / "m.json"
    model.save(path)
    again = load_compute_model(path)
    assert again.colocated.forward_s(8) == pytest.approx(model.colocated.forward_s(8))
    assert again.colocated_workers == 2 and again.buffer_bytes == 1704
    bad = {**data, "colocated": {**data["colocated"], "points": [{**data["points"][0], "batch": 512}]
                                 + data["points"][1:]}}
    with pytest.raises(ProblemError, match=r"colocated\.points\[0\]\.batch.*max_batch 256"):
        parse_profile(bad, source="bad.json")


# -- the file formats: shipped files round trip, a bad field is named by its path ----------

SHIPPED_PROFILES = profile_files()


@pytest.mark.parametrize("path", SHIPPED_PROFILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_profile_round_trips_and_its_fitted_model_too(path, tmp_path):
    save_profile(load_profile(path), tmp_path / "p.json")
    assert json.loads((tmp_path / "p.json").read_text()) == json.loads(path.read_text())
    model = load_compute_model(path)
    saved = json.loads(json.dumps(model.to_json()))
    again = ComputeModel.from_json(saved, source="m.json")
    assert again == model
    assert again.to_json() == saved


def _saved_model() -> dict:
    data = profile_dict(device="cpu")
    data["colocated"] = {"workers": 2, "host_cores": 2, "points": data["points"]}
    return ComputeModel.from_profile(ComputeProfile.model_validate(data)).to_json()


@pytest.mark.parametrize("loc,value,path,message", [
    (("forward", "knots"), [64.0, 16.0], "forward.knots[1]", "is 16, but must be larger than the one before (64)"),
    (("backward", "slope_changes"), "one more than knots", "backward.slope_changes",
     "entries, but must have one per entry"),
    (("forward", "slope"), "steep", "forward.slope", "input should be a valid number"),
    (("cv", "batches", 2), 1.5, "cv.batches[2]", "is 1.5, but must be larger than the one before (2)"),
    (("cv", "forward"), [0.01], "cv.forward", "has 1 entries, but must have one per entry of cv.batches (9)"),
    (("profiled", "backward_s", 0), 0, "profiled.backward_s[0]", "is 0, but must be greater than 0"),
    (("layers", 1, "ready_frac"), 1.5, "layers[1].ready_frac", "is 1.5, but must be at most 1"),
    (("max_batch",), 0, "max_batch", "is 0, but must be greater than 0"),
    (("step_s",), -0.001, "step_s", "is -0.001, but must be at least 0"),
    (("provenance", "kind"), "guessed", "provenance.kind", "input should be 'measured', 'published' or 'derived'"),
    (("colocated", "workers"), 1, "colocated.workers", "is 1, but must be at least 2"),
    (("colocated", "model", "cv", "backward", 0), -1, "colocated.model.cv.backward[0]",
     "is -1, but must be at least 0"),
    (("format",), "thrifty.compute_profile/1", "format", "input should be 'thrifty.compute_model/1'"),
])
def test_a_bad_field_of_a_saved_model_is_named_by_its_path(loc, value, path, message):
    data = _saved_model()
    *parents, last = loc
    inner = data
    for key in parents:
        inner = inner[key]
    if value == "one more than knots":  # how many knots the fit keeps depends on the numbers, not on this test
        value = [0.1] * (len(inner["knots"]) + 1)
    inner[last] = value
    with pytest.raises(ProblemError) as e:
        ComputeModel.from_json(data, source="m.json")
    assert (e.value.source, e.value.path) == ("m.json", path)
    assert message in e.value.message, e.value.message


def test_a_model_that_would_not_load_is_not_saved(tmp_path):
    model = compute_model()
    broken = dataclasses.replace(model, provenance={})
    with pytest.raises(ProblemError, match=r"provenance\.kind: is required"):
        broken.save(tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


def test_cli_names_the_bad_field_of_a_saved_model_and_exits_2(tmp_path, capsys):
    data = _saved_model()
    data["layers"][0]["grad_bytes"] = -4
    path = _write(tmp_path, data)
    assert main(["simulate", "--model", str(path), "--config", "local@16"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: layers[0].grad_bytes: is -4, but must be greater than 0" in err
    assert "Traceback" not in err
