"""A Ray cluster started the way the README says, with Ray's own command line
(``ray start --head --node-ip-address=127.0.0.1 --port=PORT``, then ``ray
start --address=127.0.0.1:PORT --node-ip-address=127.0.0.1`` for a second
node, both local-a spot machines by their resources; `ray_cluster.RayStartCluster`:
its own temporary folder and free ports, stopped by its own processes), and
``thrifty run`` / ``thrifty tune`` on it as a user runs them, in subprocesses.

On this host Ray registers such nodes under the host's other address
(192.0.2.2 here), not 127.0.0.1; the driver must join through the address
given, whatever address the nodes have. The terminal (the subprocess's
stdout and stderr) shows thrifty's lines only: what Ray and torch print goes
to the run's ``logs/driver.log``. ``thrifty tune --dry-run`` runs every check
the run makes (the cluster's nodes read without joining it, the catalog, the
slots, the market) and reports every problem at once.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed; `pip install 'thrifty[ray]'` runs these tests")
pytest.importorskip("torch")

from thrifty.core.errors import ProblemError  # noqa: E402
from thrifty.runtime.cluster.connect import connect  # noqa: E402

from ray_cluster import RayStartCluster, free_port  # noqa: E402

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "datasets" / "examples" / "local-demo-srifty54.json"
CATALOG = ROOT / "datasets" / "examples" / "local-demo-catalog.json"
SPOT_A = {"thrifty-type:local-a": 1, "thrifty-market:spot": 1}  # the README's cluster example
TINY = "thrifty.runtime.training.examples:tiny_mlp"

# Lines that are Ray's or torch's, not thrifty's
FOREIGN = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b"  # Ray's Python logging
    r"|^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [DIWEF] \d+ \d+\]"  # Ray's C++ logging
    r"|^\[[DIWEF]\d{4} \d\d:\d\d:\d\d"  # torch's C++ logging (c10)
    r"|^\((raylet|autoscaler|[\w.]+ pid=\d+|pid=\d+)"  # lines Ray forwards from the cluster's processes
    r"|\[state-dump\]|\[c10d\]|^frame #\d|Traceback \(most recent call last\)")


def foreign_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if FOREIGN.search(line.strip())]


def test_the_foreign_line_patterns_catch_what_ray_and_torch_print():
    seen = [
        "2026-11-26 15:14:48,258\tINFO worker.py:1841 -- Connecting to existing Ray cluster at address: 127.0.0.1:6390",
        "[2026-11-26 15:26:35,852 W 23163 23163] rpc_client.h:153: Failed to connect to GCS at address 127.0.0.1:1",
        "[W1126 15:25:20.220047060 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=4): Connection reset",
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x9d (0x7fa053d79b8d in libc10.so)",
        "(raylet) [state-dump] NodeManager:",
        "(MachineAgent pid=7082) hello",
    ]
    assert foreign_lines("\n".join(seen)) == seen
    assert foreign_lines("thrifty run: finished OUTSIDE the limits: time 58.4 s > limit 30 s\n"
                         "   0.12  launch        segment 0: 2 workers 2xlocal-a@32 from iteration 0") == []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    made = RayStartCluster(tmp_path_factory.mktemp("ray-start"), [SPOT_A, SPOT_A])
    yield made
    made.close()
    assert made.processes() == []  # this cluster is gone, and only this one was stopped


def thrifty(cluster: RayStartCluster, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``thrifty ARGS`` as a user runs it beside `cluster` (with its token in the environment)."""
    return subprocess.run([sys.executable, "-m", "thrifty.runtime.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=480, env={**cluster.process_env(), "COLUMNS": "200"})


def python(cluster: RayStartCluster, code: str) -> str:
    """What `code`, run by a process beside `cluster`, prints last."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                          env=cluster.process_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()[-1]


def jobs(cluster: RayStartCluster) -> int:
    """How many drivers have joined the cluster so far (Ray's job table, read from its GCS)."""
    return int(python(cluster, "from ray._private import services, state; t = state.GlobalState(); "
                               f"t._initialize_global_state(services._get_gcs_client_options({cluster.address!r})); "
                               "print(len(t.job_table()))"))


def test_the_cluster_registered_its_nodes_and_a_driver_joins_it_at_the_address_given(cluster):
    nodes = json.loads(python(cluster, "import json; from thrifty.runtime.cluster.connect import read_nodes; "
                                       f"print(json.dumps(read_nodes({cluster.address!r})))"))
    alive = [n for n in nodes if n["Alive"]]
    assert len(alive) == 2 and all(n["Resources"].get("thrifty-type:local-a") == 1 for n in alive)
    # whatever address Ray chose for the nodes (on this host: its outbound one, not 127.0.0.1), the run joins
    # through the one given, at once (it waited 65 s, then failed, looking for a node registered at 127.0.0.1)
    started = time.monotonic()
    joined = python(cluster, "from thrifty.runtime.cluster.connect import connect; "
                             f"connect({cluster.address!r}); import ray; print(len(ray.nodes()))")
    assert joined == "2" and time.monotonic() - started < 45


def write_problem(folder: Path) -> Path:
    """The demo, on the cluster's machines only, with room for a loaded host (a run's time is not what
    these tests check)."""
    problem = json.loads(DEMO.read_text())
    problem.update(catalog=str(CATALOG), iterations=200, limits={"time_s": 900, "cost_usd": 5.0},
                   instances=[{"instance_type": "local-a", "market": "spot", "quota": 2}])
    path = folder / "problem.json"
    path.write_text(json.dumps(problem))
    return path


def test_thrifty_run_on_the_cluster_succeeds_and_ray_stays_off_the_terminal(cluster, tmp_path):
    run_dir = tmp_path / "run"
    done = thrifty(cluster, tmp_path, "run", str(write_problem(tmp_path)), "--trainer", TINY,
                   "--cluster", cluster.address, "--run-dir", str(run_dir), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["iterations"] == 200
    assert foreign_lines(done.stdout + done.stderr) == [], done.stderr
    log = (run_dir / "logs" / "driver.log").read_text()
    assert f"Connecting to existing Ray cluster at address: {cluster.address}" in log  # Ray's lines went here


def experiment(**resources) -> dict:
    return {"name": "on-ray", "trainer": "thrifty.runtime.tuning.executors.worlds:example_trainer",
            "search_space": {"lr": {"loguniform": [0.003, 0.5]}}, "samples": 2, "seed": 1, "max_iterations": 2,
            "scheduler": "fifo", "iteration_timeout_s": 120,
            "resources": {"atoms": 2, "instance_type": "local-a", "machines": 2, "catalog": str(CATALOG),
                          **resources}}


def test_thrifty_tune_takes_the_spot_nodes_its_file_asks_for_and_keeps_ray_off_the_terminal(cluster, tmp_path):
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(experiment(market="spot")))
    dry = thrifty(cluster, tmp_path, "tune", str(path), "--cluster", cluster.address, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    out = tmp_path / "out"
    done = thrifty(cluster, tmp_path, "tune", str(path), "--cluster", cluster.address, "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["trials"] == {"completed": 2} and summary["best"]["trial"] is not None
    assert foreign_lines(done.stdout + done.stderr) == [], done.stderr
    assert "Connected to Ray cluster" in (out / "logs" / "driver.log").read_text()
    # what a resume restores (test_tune_resume.py::test_resume_restores_the_cluster_the_run_was_started_with)
    from thrifty.runtime.tuning.driver import stored_options

    assert stored_options(out)["cluster"] == cluster.address


def test_a_tune_dry_run_reports_every_problem_of_the_run_at_once_and_joins_nothing(cluster, tmp_path):
    before = jobs(cluster)
    cases = {  # the experiment's resources -> the problems its run would stop at, one line each
        "no-type": ({"instance_type": None}, ["resources.instance_type: is required on a cluster"]),
        "on-demand": ({}, ["cluster: the Ray cluster at", "2 x local-a (on_demand): the cluster has 0",
                           "(resources.market spot would take them)"]),
        "slots": ({"atoms": 3, "market": "spot"}, ["resources.atoms: is 3, more than the 2 slots of 2 x local-a"]),
        "three": ({"catalog": None, "market": "spot", "machines": 3, "trainer_args": {"depth": 2}},
                  ["3 problems; nothing was started",
                   "trainer_args.depth: the trainer",
                   "resources.instance_type: unknown instance type 'local-a' in catalog",
                   "3 x local-a (spot): the cluster has 2"]),
    }
    for name, (changes, said) in cases.items():
        spec = experiment()
        spec["trainer_args"] = changes.pop("trainer_args", {})
        spec["resources"].update(changes)
        spec["resources"] = {k: v for k, v in spec["resources"].items() if v is not None}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(spec))
        out = tmp_path / f"out-{name}"
        args = ("tune", str(path), "--cluster", cluster.address, "--out", str(out))
        dry = thrifty(cluster, tmp_path, *args, "--dry-run")
        assert dry.returncode == 2, (name, dry.stdout, dry.stderr)
        for text in said:
            assert text in dry.stderr, (name, text, dry.stderr)
        assert "Traceback" not in dry.stderr and foreign_lines(dry.stderr) == []
        # the real run stops at the same problems, before it starts anything
        run = thrifty(cluster, tmp_path, *args)
        assert run.returncode == 2 and run.stderr == dry.stderr, (name, run.stderr)
        assert not out.exists()
    assert jobs(cluster) == before  # neither joined the cluster: its nodes were read from its GCS


def test_an_address_where_no_cluster_answers_is_a_clear_error_at_once():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(ProblemError) as error:
        connect(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 15  # not Ray's minute of retries
    assert error.value.path == "cluster" and f"no Ray cluster answers at 127.0.0.1:{port}" in str(error.value)
