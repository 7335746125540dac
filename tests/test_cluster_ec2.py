"""``thrifty run --cluster cluster.yaml`` with ``provider: ec2``, end to end on
this host: the driver (a real ``thrifty run`` process) starts a Ray head on
127.0.0.1, launches spot instances on a moto server with the join script as
their user data, and waits for them to join; `ec2_harness.Ec2Harness` plays
EC2 (each running instance's user data really runs under bash, with its own
IMDSv2 server, and becomes a Ray node; a terminated instance's node is
killed). Mid-run the harness posts a spot notice on one of the machines the
run trains on and takes that machine 10 s later. The run must finish with
the parameters of an uninterrupted single process, lose no iteration, keep
its checkpoint in S3 (moto), and leave no instance running and no head.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="Ray is not installed; `pip install 'thrifty[ray]'` runs these tests")
torch = pytest.importorskip("torch")
pytest.importorskip("moto", reason="moto is not installed; `pip install 'thrifty[test]'` runs these tests")

from aws_fakes import free_port, moto_server  # noqa: E402
from ec2_harness import Ec2Harness  # noqa: E402
from test_training_runtime_processes import max_difference  # noqa: E402
from thrifty.runtime.ddp.steps import single_process_reference  # noqa: E402

pytestmark = pytest.mark.timeout(420)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "datasets" / "examples" / "local-demo-srifty54.json"
CATALOG = ROOT / "datasets" / "examples" / "local-demo-catalog.json"
TINY = "thrifty.runtime.training.examples:tiny_mlp"
BUCKET = "thrifty-checkpoints"
# Ray's health checks, read from the environment by the head the driver starts: a dead node in ~1.5 s
FAST_HEALTH_CHECKS = {"RAY_health_check_initial_delay_ms": "0", "RAY_health_check_period_ms": "500",
                      "RAY_health_check_timeout_ms": "1000", "RAY_health_check_failure_threshold": "3"}


@pytest.fixture(scope="module")
def moto():
    with moto_server() as server, pytest.MonkeyPatch.context() as mp:
        # the driver, and through the harness every played machine (its workers write the checkpoint), talk to moto
        mp.setenv("AWS_ENDPOINT_URL", server.url)
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.delenv("RAY_ADDRESS", raising=False)
        server.client("s3").create_bucket(Bucket=BUCKET)
        yield server


def write_inputs(folder: Path, port: int) -> tuple[Path, Path]:
    """The demo problem with room for machines that boot (a time limit of
    minutes), and a cluster config for moto: a head on 127.0.0.1:`port`,
    instances with thrifty already on them, catalog prices."""
    problem = json.loads(DEMO.read_text())
    problem.update(catalog=str(CATALOG), limits={"time_s": 300, "cost_usd": 0.5})
    (folder / "problem.json").write_text(json.dumps(problem))
    config = {"provider": "ec2", "region": "us-east-1", "ami": "ami-0123456789abcdef0", "install": "none",
              "setup_commands": ["echo booting $(hostname)"], "head_ip": "127.0.0.1", "ray_port": port,
              "prices": "catalog", "catalog": str(CATALOG), "launch_timeout_s": 60, "join_timeout_s": 90,
              "poll_interval_s": 0.5, "imds_interval_s": 0.2}
    (folder / "cluster.yaml").write_text(json.dumps(config))  # JSON is YAML
    return folder / "problem.json", folder / "cluster.yaml"


def run_log(run_dir: Path) -> list[dict]:
    path = run_dir / "run.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_for(condition, timeout_s: float, what: str, driver: subprocess.Popen):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if driver.poll() is not None:
            raise AssertionError(f"the driver exited with {driver.returncode} before {what}:\n"
                                 f"{driver.stderr.read()[-6000:] if driver.stderr else ''}")
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout_s:g} s")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_run_from_an_ec2_cluster_config_joins_trains_survives_a_notice_and_leaves_nothing(moto, tmp_path):
    port = free_port()
    problem, cluster = write_inputs(tmp_path, port)
    run_dir = tmp_path / "run"
    checkpoint = f"s3://{BUCKET}/{tmp_path.name}/checkpoint.pt"
    argv = [sys.executable, "-m", "thrifty.runtime.cli", "run", str(problem),
            "--trainer", TINY, "--cluster", str(cluster), "--run-dir", str(run_dir), "--checkpoint", checkpoint,
            "--checkpoint-every", "50", "--no-replan-on-slowdown", "--json",
            # the tiny model takes ~1 ms an iteration: 30 ms more on machine 0 leaves time for a notice
            "--inject", "slow:machine=0,from=0,extra=0.03"]
    env = {**os.environ, **FAST_HEALTH_CHECKS}
    with Ec2Harness(moto, tmp_path / "instances", boot_timeout_s=90) as harness:
        harness.start()
        driver = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            launch = wait_for(lambda: next((e for e in run_log(run_dir) if e["event"] == "launch"), None), 240,
                              "first launch", driver)
            wait_for(lambda: any(e["event"] == "checkpoint" and e["iteration"] >= 200 for e in run_log(run_dir)),
                     240, "checkpoint at iteration 200", driver)
            spot = [m for m in launch["machines"] if harness.played(m).market == "spot"]
            assert spot, f"the first plan ({launch['config']}) has no spot machine to take"
            noticed = spot[0]
            harness.notice(noticed, in_s=10.0)
            time.sleep(10.0)
            if not harness.played(noticed).killed:  # the run gave it back already: moto ended it, the harness too
                harness.take_away(noticed, notice=False)
            out, err = driver.communicate(timeout=300)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
    assert driver.returncode == 0, f"thrifty run exited with {driver.returncode}:\n{err[-6000:]}"
    result = json.loads(out)
    assert result["iterations"] == 600 and result["within_limits"]

    events = run_log(run_dir)
    [preemption] = [e for e in events if e["event"] == "preemption"]
    assert (preemption["source"], preemption["machine_id"]) == ("imds", noticed)
    segments = [e for e in events if e["event"] == "segment_end"]
    assert segments[0]["ended"] == "stopped" and sum(s["lost_iterations"] for s in segments) == 0
    later = [e for e in events if e["event"] == "launch"][1:]
    assert later and all(noticed not in e["machines"] for e in later)

    # the checkpoint is in S3, and it holds what one uninterrupted process computes
    body = moto.client("s3").get_object(Bucket=BUCKET, Key=f"{tmp_path.name}/checkpoint.pt")["Body"].read()
    (tmp_path / "final.pt").write_bytes(body)
    state = torch.load(tmp_path / "final.pt", map_location="cpu", weights_only=True)["model"]
    assert max_difference(state, single_process_reference(TINY, 64, 600)) < 1e-6

    # nothing left: every instance of the run terminated, the head gone, no node of a played machine alive
    reply = moto.client("ec2").describe_instances(Filters=[{"Name": "tag:thrifty:run", "Values": [result["run_id"]]}])
    states = {i["InstanceId"]: i["State"]["Name"] for r in reply["Reservations"] for i in r["Instances"]}
    assert set(states) == set(harness.instances) and set(states.values()) == {"terminated"}, states
    assert not listening(port)
    head = subprocess.run(["pgrep", "-f", f"gcs_server_port={port}"], capture_output=True, text=True).stdout.split()
    assert head == [], f"the head's GCS still runs: {head}"


def test_profiles_measured_on_ec2_machines_of_each_type_leave_no_instance_and_say_what_they_cost(
        moto, providers, tmp_path, capsys):
    """``thrifty profile --cluster cluster.yaml`` and ``profile-scaling --cluster cluster.yaml``, in this
    process: each starts its head, launches a spot instance of its type, measures there, terminates it and
    stops the head. One type each, as every type of a command goes the same way (test_cluster_ray.py
    measures several types, and several machines of a type, in one command), and each instance boots and
    joins one after the other."""
    from cluster_profiling import assert_costs, assert_gave_everything_back
    from thrifty.perfmodels.bundle import load_bundle
    from thrifty.runtime.cli import main

    mlp = "thrifty.runtime.measure.zoo:mlp"
    ports = []
    for name in ("compute", "scaling"):
        (tmp_path / name).mkdir()
        ports.append(free_port())
        write_inputs(tmp_path / name, ports[-1])

    types = {"compute": {"local-a": 1}, "scaling": {"local-b": 1}}

    def common(name: str) -> list[str]:
        return ["--cluster", str(tmp_path / name / "cluster.yaml"), "--instance-types", ",".join(types[name]),
                "--market", "spot", "--catalog", str(CATALOG), "--no-progress", "--out", str(tmp_path / f"{name}.json")]

    with Ec2Harness(moto, tmp_path / "instances", boot_timeout_s=90) as harness:
        harness.start()
        assert main(["profile", mlp, *common("compute"), "--batches", "1,2", "--repeats", "2", "--warmup", "1",
                     "--rounds", "1"]) == 0
        printed = [capsys.readouterr().out]
        assert main(["profile-scaling", mlp, *common("scaling"), "--world-sizes", "1", "--batch", "2",
                     "--iterations", "2", "--warmup", "1"]) == 0
        printed.append(capsys.readouterr().out)

    ec2 = moto.client("ec2")
    for name, provider, out, port in zip(("compute", "scaling"), providers, printed, ports):
        bundle = load_bundle(tmp_path / f"{name}.json")
        assert (bundle.kind, sorted(bundle.profiles)) == (name, sorted(types[name]))
        assert_gave_everything_back(provider, types[name])
        assert_costs(bundle, {"local-a": 0.4, "local-b": 0.55}, out)
        assert all(r.scale_latency_s > 0 for r in bundle.machines.values())  # a launch, and a join, took time
        reply = ec2.describe_instances(Filters=[{"Name": "tag:thrifty:run", "Values": [provider.run_id]}])
        states = [i["State"]["Name"] for r in reply["Reservations"] for i in r["Instances"]]
        assert states == ["terminated"] * len(types[name])
        assert not listening(port)
