"""The allreduce grid probe with real gloo process groups on 127.0.0.1."""

from __future__ import annotations

import csv

import pytest

torch = pytest.importorskip("torch", reason="the probe runs torch.distributed; install thrifty[torch] to run these")

from thrifty.core import ProblemError  # noqa: E402
from thrifty.perfmodels.allreduce import PROBE_COLUMNS, load_probes, parse_probe_rows  # noqa: E402
from thrifty.perfmodels.bandwidth import bus_bandwidth_from_time  # noqa: E402
from thrifty.runtime.measure.probe import (  # noqa: E402
                                           ProbeConfig,
                                           ProbeFailed,
                                           ProbeTarget,
                                           buffer_sizes,
                                           instances_for,
                                           probe_allreduce,
                                           write_probe_csv,
                                           )
from thrifty.runtime.cli import main  # noqa: E402

LOCAL = ProbeTarget(instance_type="local", device="cpu", rated_network_gbps=10.0, gpus_per_instance=1)
SMALL = dict(world_sizes=(2,), max_bytes=64 * 2**10, repeats=1, concurrency=2, backend="gloo",
             op_timeout_s=30.0, stall_timeout_s=60.0)


def test_buffer_sizes_are_geometric_and_keep_both_ends():
    assert buffer_sizes(4, 64 * 2**10) == [4 * 2**i for i in range(15)]
    assert buffer_sizes(4, 100) == [4, 8, 16, 32, 64, 100]
    assert buffer_sizes(4, 1000, factor=10) == [4, 40, 400, 1000]
    assert buffer_sizes(4, 4) == [4]


def test_instances_count_whole_machines():
    assert instances_for(4, 1) == 4  # local: one worker per instance
    assert instances_for(4, 8) == 1
    assert instances_for(12, 8) == 2


def test_a_real_small_probe_gives_positive_bus_bandwidth(tmp_path):
    progress = []
    rows = probe_allreduce(LOCAL, ProbeConfig(**SMALL), on_progress=lambda *a: progress.append(a))
    sizes = [4 * 2**i for i in range(15)]
    assert [(r["buffer_bytes"], r["concurrent"]) for r in rows] == [(s, k) for s in sizes for k in (1, 2)]
    for r in rows:
        assert set(r) == set(PROBE_COLUMNS)
        assert r["seconds"] > 0 and r["busbw_bytes_per_s"] > 0
        assert r["busbw_bytes_per_s"] == pytest.approx(bus_bandwidth_from_time(r["buffer_bytes"], 2, r["seconds"]))
        assert (r["world_size"], r["instances"], r["backend"], r["repeat"]) == (2, 2, "gloo", 0)
    assert progress[-1][:2] == (30, 30)
    parse_probe_rows(rows)  # passes the loader's checks
    path = tmp_path / "probes.csv"
    write_probe_csv(rows, path)
    table = load_probes(path)
    assert list(table.seconds) == [r["seconds"] for r in rows]  # floats round-trip exactly


def test_a_probe_under_compute_load_times_the_transfer_only():
    """Each rank computes 20 ms before each timed allreduce; the burst is not
    part of the measured time. A timed burst would make every row take 20 ms
    or more; on a loaded host a 64-byte allreduce may itself take longer (a
    rank waits for the CPU), so the fastest row is what tells."""
    rows = probe_allreduce(LOCAL, ProbeConfig(**{**SMALL, "max_bytes": 64, "concurrency": 1, "load_ms": 20.0}))
    assert len(rows) == 5
    assert all(r["seconds"] > 0 for r in rows)
    assert min(r["seconds"] for r in rows) < 0.02, rows


def test_probe_allreduce_cli_writes_a_csv(tmp_path, capsys):
    out = tmp_path / "data" / "probes.csv"
    code = main([
        "probe-allreduce", "--world-sizes", "2", "--out", str(out), "--max-bytes", "64KiB",
        "--repeats", "1", "--concurrency", "2", "--instance-type", "local", "--no-progress",
    ])
    assert code == 0
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 30
    assert tuple(rows[0]) == PROBE_COLUMNS
    assert {(r["instance_type"], r["device"], r["world_size"]) for r in rows} == {("local", "cpu", "2")}
    assert all(float(r["busbw_bytes_per_s"]) > 0 for r in rows)
    assert "reproduce with: thrifty probe-allreduce --world-sizes 2" in capsys.readouterr().out


def test_a_failing_world_raises_instead_of_hanging(tmp_path, monkeypatch):
    # gloo cannot open a device on an interface that does not exist: every
    # rank fails in init_process_group and the parent reports it
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "thrifty-no-such-if")
    with pytest.raises(ProbeFailed, match="world size 2"):
        probe_allreduce(LOCAL, ProbeConfig(**SMALL))
    out = tmp_path / "probes.csv"
    code = main(["probe-allreduce", "--world-sizes", "2", "--out", str(out), "--max-bytes", "64", "--no-progress"])
    assert code == 1
    assert not out.exists()


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"world_sizes": (1,)}, "world size 1"),
        ({"world_sizes": ()}, "world_sizes is empty"),
        ({"repeats": 0}, "repeats is 0"),
        ({"max_bytes": 2}, "max_bytes is 2"),
        ({"backend": "mpi"}, "backend is 'mpi'"),
        ({"load_ms": -1.0}, "load_ms is -1.0"),
        ({"load_ms": float("nan")}, "load_ms is nan"),
    ],
)
def test_bad_probe_settings_are_problem_errors(changes, message):
    with pytest.raises(ProblemError, match=message):
        ProbeConfig(**{**SMALL, **changes})


def test_cli_rejects_a_bad_world_size_list(tmp_path, capsys):
    out = tmp_path / "probes.csv"
    assert main(["probe-allreduce", "--world-sizes", "1,2", "--out", str(out)]) == 2
    assert "--world-sizes" in capsys.readouterr().err
    assert not out.exists()
