import json

import numpy as np
import pytest

from thrifty.datasets.errors import ProblemError
from thrifty.perfmodels.compute import ComputeModel, fit_piecewise_linear, load_compute_model
from thrifty.perfmodels.profile import ComputeProfile, load_profile, parse_profile

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
