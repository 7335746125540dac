"""The learned allreduce model (Srifty 4.2) and its probe-CSV loader."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from thrifty.datasets import InstanceType

from thrifty.core import ProblemError
from thrifty.perfmodels.allreduce import (
    MIN_BUS_BANDWIDTH,
    PROBE_COLUMNS,
    Hyperparams,
    LearnedAllreduce,
    fit_allreduce,
    decay_weights,
    group_folds,
    load_probes,
    mape,
    mape_floor,
    parse_probe_rows,
    pool_repeats,
    split_groups,
)
from thrifty.perfmodels.bandwidth import (
    MTU_BYTES,
    AnalyticAllreduce,
    BandwidthModel,
    allreduce_time,
    bus_bandwidth_from_time,
)
from thrifty.runtime.cli import main

ALPHA_S = 20e-6  # per ring step
BETA = 2e9  # bytes/s, shared by concurrent transfers
WORLD_SIZES = (2, 3, 4, 6, 8)
SIZES = tuple(4 * 2**i for i in range(25))  # 4 B .. 64 MiB
# tests of routing and weighting, not of selection, fit a two-point grid
QUICK_GRID = (
    Hyperparams(3, 100, 0.2, "reg:squarederror", "log_busbw"),
    Hyperparams(3, 100, 0.2, "reg:squarederror", "log_time"),
)


def _itype(name: str, device: str = "cpu", network_gbps: float = 10.0) -> InstanceType:
    return InstanceType(
        name=name, gpus=1, device=device, gpu_memory_gib=0.0, vcpus=1, memory_gib=1.0,
        network_gbps=network_gbps, on_demand_usd_per_hour=0.0, spot_usd_per_hour=None,
    )


def _row(n: int, size: int, k: int, repeat: int, seconds: float, itype: str = "synth",
         stamp: str = "2025-01-01T00:00:00Z") -> dict:
    return {
        "timestamp": stamp,
        "instance_type": itype,
        "device": "cpu",
        "backend": "gloo",
        "rated_network_gbps": 10.0,
        "gpus_per_instance": 1,
        "instances": n,
        "world_size": n,
        "buffer_bytes": size,
        "concurrent": k,
        "repeat": repeat,
        "seconds": seconds,
        "busbw_bytes_per_s": float(bus_bandwidth_from_time(size, n, seconds)),
    }


def alpha_beta_time(size, n, k):
    """k ring allreduces of `size` bytes started together: the latency terms
    overlap, the bandwidth BETA is shared."""
    return 2 * (n - 1) * ALPHA_S + k * 2 * (n - 1) / n * np.asarray(size, dtype=float) / BETA


def alpha_beta_rows(noise: float = 0.03, repeats: int = 3, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [
        _row(n, s, k, r, float(alpha_beta_time(s, n, k)) * float(rng.lognormal(0.0, noise)))
        for n in WORLD_SIZES
        for s in SIZES
        for k in (1, 2, 3, 4)
        for r in range(repeats)
    ]


@pytest.fixture(scope="module")
def alpha_beta_model() -> LearnedAllreduce:
    return fit_allreduce(alpha_beta_rows(), seed=0)


# -- bus bandwidth conversion --------------------------------------------------------


def test_busbw_matches_hand_values():
    # 2 s (n-1) / (n t): 1 MB on 4 workers in 1 ms -> 2e6 * 3 / 4e-3 = 1.5e9 B/s
    assert bus_bandwidth_from_time(1e6, 4, 1e-3) == pytest.approx(1.5e9)
    # two workers: busbw equals the algorithm bandwidth s / t
    assert bus_bandwidth_from_time(4096, 2, 2e-3) == pytest.approx(2.048e6)
    # 8 workers, 64 MiB, 0.5 s -> 2 * 67108864 * 7 / (8 * 0.5)
    assert bus_bandwidth_from_time(64 * 2**20, 8, 0.5) == pytest.approx(234881024.0)
    assert allreduce_time(1e6, 4, 1.5e9) == pytest.approx(1e-3)


def test_loader_rejects_a_busbw_that_disagrees_with_the_seconds(tmp_path):
    row = _row(4, 1000, 1, 0, 1e-3)
    row["busbw_bytes_per_s"] = 1.0e9  # the seconds say 1.5e9
    path = _write_csv(tmp_path / "probes.csv", [row])
    with pytest.raises(ProblemError) as info:
        load_probes(path)
    _names_file_row_field(info.value, path, row=1, field="busbw_bytes_per_s")


# -- the MTU split -------------------------------------------------------------------


def _two_regime_rows() -> tuple[list[dict], float, float]:
    """Busbw is 1 MB/s at or below the MTU and 1 GB/s above it, at every size,
    world size and concurrency: the two regimes differ sharply at 9001 bytes."""
    small_bw, large_bw = 1e6, 1e9
    sizes = [4 * 2**i for i in range(12)] + [MTU_BYTES - 1, MTU_BYTES, MTU_BYTES + 1] + [16384 * 2**i for i in range(8)]
    rows = []
    for n in (2, 3, 4):
        for s in sizes:
            bw = small_bw if s <= MTU_BYTES else large_bw
            for k in (1, 2):
                for r in range(2):
                    rows.append(_row(n, s, k, r, 2 * s * (n - 1) / (n * bw)))
    return rows, small_bw, large_bw


def test_mtu_split_routes_rows_and_queries_by_buffer_size():
    rows, small_bw, large_bw = _two_regime_rows()
    model = fit_allreduce(rows, seed=1, grid=QUICK_GRID)
    cells, _ = pool_repeats(parse_probe_rows(rows))  # the fit pools repeats
    n_small = int((cells.buffer_bytes <= MTU_BYTES).sum())
    assert model.fit_report["small"].rows == n_small
    assert model.fit_report["large"].rows == len(cells) - n_small
    assert model.fit_report["small"].regime == f"buffer_bytes <= {MTU_BYTES}"
    sizes = np.array([4.0, 1000.0, MTU_BYTES - 1, MTU_BYTES, MTU_BYTES + 1, 1e6])
    predicted = model.bus_bandwidth(_itype("synth"), sizes, 3, 3)
    expected = np.where(sizes <= MTU_BYTES, small_bw, large_bw)
    np.testing.assert_allclose(predicted, expected, rtol=0.05)
    assert model.heldout_mape["small"] < 0.05 and model.heldout_mape["large"] < 0.05


def test_fit_needs_rows_on_both_sides_of_the_mtu():
    rows = [r for r in alpha_beta_rows(repeats=1) if r["buffer_bytes"] > MTU_BYTES]
    with pytest.raises(ProblemError, match="buffer_bytes <= 9001"):
        fit_allreduce(rows)


# -- fitting a known law ---------------------------------------------------------------


def test_fit_recovers_an_alpha_beta_law(alpha_beta_model):
    model = alpha_beta_model
    for name in ("small", "large"):
        assert model.heldout_mape[name] < 0.10, (name, model.fit_report[name])
    # sizes between the probed ones (log-uniform), at probed world sizes
    rng = np.random.default_rng(7)
    sizes = np.exp(rng.uniform(math.log(4), math.log(64 * 2**20), 300))
    for n in (2, 4, 8):
        predicted = model.bus_bandwidth(_itype("synth"), sizes, n, n)
        true = bus_bandwidth_from_time(sizes, n, alpha_beta_time(sizes, n, 1))
        assert mape(predicted, true) < 0.10, n


def test_cap_is_the_shared_bandwidth_of_concurrent_transfers(alpha_beta_model):
    # k concurrent transfers share BETA: the aggregate k * busbw tends to BETA
    cap = alpha_beta_model.bandwidth_cap(_itype("synth"), 4, 4)
    assert cap == pytest.approx(BETA, rel=0.10)
    lone = alpha_beta_model.bus_bandwidth(_itype("synth"), np.array([64.0 * 2**20]), 4, 4)[0]
    four = alpha_beta_model.bus_bandwidth(_itype("synth"), np.array([64.0 * 2**20]), 4, 4, concurrent=4)[0]
    assert four * 4 == pytest.approx(lone, rel=0.15)


def test_sizes_beyond_the_probes_follow_the_alpha_beta_limits(alpha_beta_model):
    itype, largest = _itype("synth"), float(SIZES[-1])
    big = alpha_beta_model.bus_bandwidth(itype, np.array([largest, 4 * largest, 64 * largest]), 4, 4)
    assert big[1] == big[0] and big[2] == big[0]  # bandwidth-bound: busbw saturates
    assert big[0] == pytest.approx(BETA, rel=0.15)
    tiny = alpha_beta_model.bus_bandwidth(itype, np.array([4.0, 2.0, 1.0]), 4, 4)
    times = allreduce_time(np.array([4.0, 2.0, 1.0]), 4, tiny)
    np.testing.assert_allclose(times, times[0])  # latency-bound: the time of 4 bytes


def test_model_is_a_bandwidth_model_with_positive_predictions(alpha_beta_model):
    assert isinstance(alpha_beta_model, BandwidthModel)
    out = alpha_beta_model.bus_bandwidth(_itype("synth"), np.array([4.0, 5.0, 1e9]), 64, 64)
    assert np.all(out >= MIN_BUS_BANDWIDTH)


def test_repeated_queries_are_cached_copies(alpha_beta_model):
    sizes = np.array([1e3, 2e5, 3e7])
    first = alpha_beta_model.bus_bandwidth(_itype("synth"), sizes, 3, 3)
    first[:] = -1.0  # the caller owns what it gets
    again = alpha_beta_model.bus_bandwidth(_itype("synth"), sizes, 3, 3)
    assert np.all(again > 0)
    one_by_one = [alpha_beta_model.bus_bandwidth(_itype("synth"), np.array([s]), 3, 3)[0] for s in sizes]
    np.testing.assert_array_equal(again, one_by_one)
    grid = alpha_beta_model.bus_bandwidth(_itype("synth"), sizes.reshape(3, 1), 3, 3)
    assert grid.shape == (3, 1)


def test_mape_floor_is_the_best_constant_per_cell():
    keys = np.array(["a", "a", "a", "b", "b"])
    values = np.array([1.0, 2.0, 10.0, 5.0, 5.0])
    # cell a: c = 1 errs by 0, 1/2 and 9/10, the least any constant can do there
    assert mape_floor(keys, values, np.ones(5)) == pytest.approx((0.0 + 0.5 + 0.9 + 0 + 0) / 5)
    for c in np.linspace(0.5, 12, 100):
        assert mape(np.full(3, c), values[:3]) >= (0.5 + 0.9) / 3 - 1e-12


def test_decayed_weights_halve_every_half_life():
    np.testing.assert_allclose(decay_weights(np.array([0.0, 7.0, 14.0]), 7.0), [1.0, 0.5, 0.25])
    np.testing.assert_array_equal(decay_weights(np.array([0.0, 100.0]), None), [1.0, 1.0])
    with pytest.raises(ProblemError, match="half_life_days"):
        decay_weights(np.array([1.0]), 0.0)


def test_half_life_lets_new_probes_outweigh_stale_ones():
    """Old probes say 1 GB/s, new ones (30 days later) 0.25 GB/s: with a
    2-day half-life the model follows the new ones."""
    rows = []
    for stamp, bw in (("2025-01-01T00:00:00Z", 1e9), ("2025-01-31T00:00:00Z", 0.25e9)):
        for n in (2, 3, 4):
            for s in [4 * 4**i for i in range(12)]:
                rows.append({**_row(n, s, 1, 0, 2 * s * (n - 1) / (n * bw)), "timestamp": stamp})
    model = fit_allreduce(rows, half_life_days=2.0, grid=QUICK_GRID)
    predicted = model.bus_bandwidth(_itype("synth"), np.array([2.0**20]), 3, 3)[0]
    assert predicted == pytest.approx(0.25e9, rel=0.10)


def test_group_split_keeps_each_group_on_one_side():
    keys = np.array([f"g{i % 10}" for i in range(100)])
    holdable = np.array([not k.endswith(("0", "9")) for k in keys])  # g0 and g9: range edges
    fit, test = split_groups(keys, seed=3, fraction=0.2, holdable=holdable)
    assert not (fit & test).any() and (fit | test).all()
    for key in set(keys):
        assert fit[keys == key].all() or test[keys == key].all()
    assert len(set(keys[test])) == 2
    assert not test[~holdable].any()  # edges are never held out
    again = split_groups(keys, seed=3, fraction=0.2, holdable=holdable)
    assert np.array_equal(test, again[1])


def test_folds_partition_the_eligible_groups():
    keys = np.array([f"g{i % 12}" for i in range(120)])
    eligible = np.array([k != "g0" for k in keys])
    folds = group_folds(keys, eligible, folds=5, seed=1)
    assert len(folds) == 5
    assert sum(f.astype(int) for f in folds).max() == 1  # disjoint
    assert np.array_equal(np.logical_or.reduce(folds), eligible)
    for fold in folds:
        for key in set(keys[fold]):
            assert fold[keys == key].all()


def test_too_few_groups_to_hold_out_is_a_problem_error():
    rows = [_row(2, s, 1, 0, 1e-3) for s in (4, 8, 16, 32, 100_000, 200_000, 400_000, 800_000)]
    with pytest.raises(ProblemError, match="small submodel.*probe more buffer sizes"):
        fit_allreduce(rows)


# -- save / load -----------------------------------------------------------------------


def test_save_load_round_trip_gives_identical_predictions(alpha_beta_model, tmp_path):
    path = tmp_path / "model.json"
    alpha_beta_model.save(path)
    loaded = LearnedAllreduce.load(path)
    rng = np.random.default_rng(11)
    sizes = np.exp(rng.uniform(math.log(4), math.log(2**30), 500))
    for n in (2, 3, 5, 8, 16):
        for k in (1, 3):
            np.testing.assert_array_equal(
                loaded.bus_bandwidth(_itype("synth"), sizes, n, n, concurrent=k),
                alpha_beta_model.bus_bandwidth(_itype("synth"), sizes, n, n, concurrent=k),
            )
        assert loaded.bandwidth_cap(_itype("synth"), n, n) == alpha_beta_model.bandwidth_cap(_itype("synth"), n, n)
    assert loaded.heldout_mape == alpha_beta_model.heldout_mape
    assert loaded.fit_report == alpha_beta_model.fit_report
    assert loaded.coverage == alpha_beta_model.coverage


def test_saved_file_embeds_xgboost_json_boosters(alpha_beta_model, tmp_path):
    import json

    path = tmp_path / "model.json"
    alpha_beta_model.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == "thrifty.allreduce_model/1"
    for name in ("small", "large"):
        booster = data["submodels"][name]["booster"]
        assert "learner" in booster and "version" in booster  # xgboost's JSON model document
    caps = {(c["instance_type"], c["world_size"], c["instances"]) for c in data["caps"]}
    assert caps == {("synth", n, n) for n in WORLD_SIZES}
    assert data["instance_types"]["synth"]["world_sizes"] == list(WORLD_SIZES)


def test_loading_a_file_that_is_not_a_model_names_it(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"format": "thrifty.catalog/1"}')
    with pytest.raises(ProblemError, match="other.json"):
        LearnedAllreduce.load(path)


# -- types without probes --------------------------------------------------------------


def test_uncovered_types_fall_back_to_the_analytic_model_and_say_so(alpha_beta_model):
    covered, other = _itype("synth"), _itype("p3.8xlarge", device="V100", network_gbps=10.0)
    assert alpha_beta_model.covers(covered) and alpha_beta_model.source(covered) == "learned"
    assert not alpha_beta_model.covers(other) and alpha_beta_model.source(other) == "analytic"
    sizes = np.array([4.0, 1e4, 1e8])
    analytic = AnalyticAllreduce()
    np.testing.assert_array_equal(
        alpha_beta_model.bus_bandwidth(other, sizes, 8, 2), analytic.bus_bandwidth(other, sizes, 8, 2)
    )
    assert alpha_beta_model.bandwidth_cap(other, 8, 2) == analytic.bandwidth_cap(other, 8, 2)


def test_the_fallback_is_injectable(alpha_beta_model, tmp_path):
    path = tmp_path / "model.json"
    alpha_beta_model.save(path)
    slow = AnalyticAllreduce(network_efficiency=0.1)
    model = LearnedAllreduce.load(path, fallback=slow)
    other = _itype("g4dn.12xlarge", device="T4", network_gbps=50.0)
    assert model.bandwidth_cap(other, 8, 2) == slow.bandwidth_cap(other, 8, 2)


# -- bad probe CSVs ----------------------------------------------------------------------


def _write_csv(path: Path, rows: list[dict], columns=PROBE_COLUMNS) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in row.items()})
    return path


def _names_file_row_field(error: ProblemError, path: Path, row: int, field: str) -> None:
    text = str(error)
    assert str(path) in text
    assert f"row {row} " in text
    assert f"'{field}'" in text


def _good_rows() -> list[dict]:
    return alpha_beta_rows(repeats=1)[:40]


def _bad_seconds(value: str):
    def change(rows):
        rows[2]["seconds"] = value
        rows[2]["busbw_bytes_per_s"] = 1.0
    return change


BAD_INPUTS = {
    "nan seconds": (_bad_seconds("nan"), "seconds"),
    "zero seconds": (_bad_seconds("0.0"), "seconds"),
    "negative seconds": (_bad_seconds("-0.001"), "seconds"),
    "empty seconds": (_bad_seconds(""), "seconds"),
    "nan busbw": (lambda rows: rows[2].update(busbw_bytes_per_s="NaN"), "busbw_bytes_per_s"),
    "fractional world size": (lambda rows: rows[2].update(world_size="2.5"), "world_size"),
    "text world size": (lambda rows: rows[2].update(world_size="two"), "world_size"),
    "world size one": (lambda rows: rows[2].update(world_size=1, instances=1), "world_size"),
    "zero buffer": (lambda rows: rows[2].update(buffer_bytes=0), "buffer_bytes"),
    "bad timestamp": (lambda rows: rows[2].update(timestamp="yesterday"), "timestamp"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_probe_values_name_file_row_and_field(tmp_path, case):
    change, field = BAD_INPUTS[case]
    rows = _good_rows()
    change(rows)
    path = _write_csv(tmp_path / "probes.csv", rows)
    with pytest.raises(ProblemError) as info:
        load_probes(path)
    _names_file_row_field(info.value, path, row=3, field=field)
    assert "line 4" in str(info.value)


def test_missing_column_names_file_header_and_column(tmp_path):
    columns = [c for c in PROBE_COLUMNS if c != "seconds"]
    path = _write_csv(tmp_path / "probes.csv", _good_rows(), columns=columns)
    with pytest.raises(ProblemError) as info:
        load_probes(path)
    text = str(info.value)
    assert str(path) in text and "header (line 1)" in text and "'seconds'" in text


def test_rows_given_as_mappings_are_checked_too():
    rows = _good_rows()
    rows[4]["seconds"] = -1.0
    with pytest.raises(ProblemError, match=r"row 5, field 'seconds'"):
        parse_probe_rows(rows, source="probe output")


@pytest.mark.parametrize("case", ["missing column", "nan seconds", "zero seconds", "negative seconds"])
def test_fit_allreduce_cli_writes_nothing_on_bad_input(tmp_path, capsys, case):
    good = _write_csv(tmp_path / "good.csv", _good_rows())
    if case == "missing column":
        bad = _write_csv(tmp_path / "bad.csv", _good_rows(), columns=[c for c in PROBE_COLUMNS if c != "seconds"])
    else:
        rows = _good_rows()
        _bad_seconds({"nan seconds": "nan", "zero seconds": "0", "negative seconds": "-1e-3"}[case])(rows)
        bad = _write_csv(tmp_path / "bad.csv", rows)
    out = tmp_path / "out" / "model.json"
    code = main(["fit-allreduce", str(good), str(bad), "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "bad.csv" in err and "'seconds'" in err
    assert not out.exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_fit_allreduce_cli_fits_and_saves(tmp_path, capsys):
    rows = [r for r in alpha_beta_rows(repeats=1) if r["world_size"] in (2, 4) and r["concurrent"] <= 2]
    probes = _write_csv(tmp_path / "probes.csv", rows)
    out = tmp_path / "model.json"
    assert main(["fit-allreduce", str(probes), "--out", str(out), "--half-life-days", "30"]) == 0
    printed = capsys.readouterr().out
    assert "held-out" in printed and "small" in printed and "large" in printed
    model = LearnedAllreduce.load(out)
    assert model.source(_itype("synth")) == "learned"
    assert model.training["half_life_days"] == 30.0
    assert model.provenance["kind"] == "derived"
    assert "thrifty fit-allreduce" in model.provenance["script"]
    assert model.provenance["inputs"][0]["digest"].startswith("sha256:")


def test_mape_weights_lean_towards_the_slow_repeats():
    """Every configuration has four repeats at the law and one 10x slower:
    MAPE-leaning weights predict below the median, plain ones near it."""
    rows = []
    for n in (2, 3, 4):
        for s in [4 * 4**i for i in range(12)]:
            t = float(alpha_beta_time(s, n, 1))
            rows += [_row(n, s, 1, r, t * (10.0 if r == 4 else 1.0)) for r in range(5)]
    plain, leaning = (
        fit_allreduce(
            rows, grid=[Hyperparams(3, 100, 0.2, "reg:absoluteerror", "log_time", relative)], pool=False
        )
        for relative in (False, True)
    )
    sizes = np.array([4.0 * 4**i for i in range(12)])
    median = bus_bandwidth_from_time(sizes, 3, alpha_beta_time(sizes, 3, 1))
    np.testing.assert_allclose(plain.bus_bandwidth(_itype("synth"), sizes, 3, 3), median, rtol=0.15)
    assert np.all(leaning.bus_bandwidth(_itype("synth"), sizes, 3, 3) < 0.5 * median)
    assert leaning.heldout_mape["large"] < plain.heldout_mape["large"]


def test_a_small_grid_can_be_given():
    grid = [Hyperparams(3, 50, 0.3, "reg:pseudohubererror", "log_busbw")]
    model = fit_allreduce(alpha_beta_rows(repeats=1), grid=grid)
    assert all(r.candidates == 1 and r.hyperparams == grid[0] for r in model.fit_report.values())


def test_pooling_keeps_one_row_per_cell_at_its_mean_time():
    rows = [_row(2, 1024, 1, r, t, stamp=f"2025-01-0{r + 1}T00:00:00Z") for r, t in enumerate((1e-3, 3e-3, 2e-3))]
    rows.append(_row(2, 1024, 2, 0, 5e-3))
    pooled, weights = pool_repeats(parse_probe_rows(rows))
    assert len(pooled) == 2 and list(weights) == [1.0, 1.0]
    lone = pooled.select(pooled.concurrent == 1)
    assert lone.seconds[0] == pytest.approx(2e-3)
    assert lone.busbw[0] == pytest.approx(bus_bandwidth_from_time(1024, 2, 2e-3))
    assert lone.repeat[0] == 3
    assert lone.timestamp[0] == parse_probe_rows(rows).timestamp.max()  # the newest of the three


def test_pooled_fit_predicts_the_mean_time_of_bimodal_repeats():
    """Half the repeats at the law, half 10x slower: the pooled model predicts
    the mean time (5.5x the law); a row-wise fit lands on one of the modes."""
    rows = []
    for n in (2, 3, 4):
        for s in [4 * 4**i for i in range(12)]:
            t = float(alpha_beta_time(s, n, 1))
            rows += [_row(n, s, 1, r, t * (10.0 if r % 2 else 1.0)) for r in range(6)]
    grid = [Hyperparams(3, 100, 0.2, "reg:absoluteerror", "log_time")]
    pooled = fit_allreduce(rows, grid=grid)
    sizes = np.array([4.0 * 4**i for i in range(1, 11)])
    mean_time = 5.5 * alpha_beta_time(sizes, 3, 1)
    predicted = allreduce_time(sizes, 3, pooled.bus_bandwidth(_itype("synth"), sizes, 3, 3))
    np.testing.assert_allclose(predicted, mean_time, rtol=0.15)
    assert pooled.training["rows"] == len(rows) and pooled.training["training_rows"] == len(rows) // 6


def test_time_between_probed_sizes_is_interpolated_in_log_size(alpha_beta_model):
    # at the geometric midpoint of two probed sizes the time is the geometric mean
    # of the times at the two: trees alone would give one of them
    itype, lo, hi = _itype("synth"), float(SIZES[-3]), float(SIZES[-2])
    mid = math.sqrt(lo * hi)
    b = alpha_beta_model.bus_bandwidth(itype, np.array([lo, mid, hi]), 4, 4)
    t = allreduce_time(np.array([lo, mid, hi]), 4, b)
    assert t[1] == pytest.approx(math.sqrt(t[0] * t[2]), rel=1e-9)
    assert t[0] < t[1] < t[2]


def test_concurrency_levels_are_the_probed_ones_and_beyond_them_as_at_the_last(alpha_beta_model):
    itype, sizes = _itype("synth"), np.array([3e5, 3e7])
    assert alpha_beta_model.concurrency_levels(itype) == 4
    four = alpha_beta_model.bus_bandwidth(itype, sizes, 4, 4, concurrent=4)
    np.testing.assert_array_equal(alpha_beta_model.bus_bandwidth(itype, sizes, 4, 4, concurrent=9), four)
    assert alpha_beta_model.concurrency_levels(_itype("unprobed")) == 1  # the analytic fallback
