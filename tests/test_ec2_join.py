"""EC2 machines join the run's Ray cluster from their user data
(docs/architecture.md, "Machines and launchers").

The join script's rendering and quoting are checked by running it under bash
with stand-ins for ``python3`` and ``thrifty`` that print their arguments.
``thrifty node join`` refuses bad input with exit 2. Then the whole path
against real parts: `Ec2Provider.provision` launches two spot instances on a
moto server with `join_script` as their user data; the EC2 harness
(`ec2_harness`) boots them, running that user data under bash with each
instance's own IMDSv2 server; both join a real Ray cluster whose head runs
here on 127.0.0.1 (one per module), marked by their instance id, type and
market; a task pinned to each machine runs there and sees that machine's spot
notice; a killed machine's node is reported dead; ``close()`` gives every
instance back.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aws_fakes import REGION, free_port, moto_server
from ec2_harness import FAST_HEALTH_CHECKS, OBJECT_STORE_BYTES, Ec2Harness
from thrifty.core.errors import ProblemError
from thrifty.core.validation import json_object
from thrifty.runtime.cli import main
from thrifty.runtime.cluster.bootstrap import install_command, join_script, ray_start_command
from thrifty.runtime.cluster.resources import (
    machine_resource,
    market_resource,
    node_marks,
    node_resources,
    type_resource,
)
from thrifty.runtime.providers.config import parse_cluster_config
from thrifty.runtime.providers.ec2 import Ec2Provider

AMI = "ami-0123456789abcdef0"
JOIN_TIMEOUT_S = 60.0


def config(**fields):
    return parse_cluster_config({"region": REGION, "ami": AMI, "prices": "catalog", "poll_interval_s": 0.05,
                                 "launch_timeout_s": 10, **fields})


# -- the join script ----------------------------------------------------------------------------------------------

def run_script(script: str, tmp_path) -> list[list[str]]:
    """Run `script` under bash with `python3` and `thrifty` that print their
    argv (one JSON list per call): what the machine would have run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python3", "thrifty"):
        stub = bin_dir / name
        stub.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(['{name}', *sys.argv[1:]]))\n")
        stub.chmod(0o755)
    (tmp_path / "user-data.sh").write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", "user-data.sh"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    import json

    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[")]


def test_join_script_runs_setup_then_installs_the_drivers_version_then_joins(tmp_path):
    script = join_script(config(setup_commands=["echo \"setting up\" > setup.txt"]), "10.0.0.5:6379",
                         version="0.1.0")
    assert script.startswith("#!/bin/bash\n") and "\nset -euo pipefail\n" in script
    calls = run_script(script, tmp_path)
    assert (tmp_path / "setup.txt").read_text() == "setting up\n"  # setup commands run as written, as shell
    assert calls == [["python3", "-m", "pip", "install", "thrifty[ray,torch]==0.1.0"],
                     ["thrifty", "node", "join", "--address", "10.0.0.5:6379"]]


@pytest.mark.parametrize("install, requirement", [
    ("/opt/wheels/thrifty-0.1.0-py3-none-any.whl", "thrifty[ray,torch] @ file:///opt/wheels/thrifty-0.1.0-py3-none-any.whl"),
    ("https://example.com/w/thrifty-0.1.0-py3-none-any.whl?sig=a'b&x=$HOME;rm",
     "thrifty[ray,torch] @ https://example.com/w/thrifty-0.1.0-py3-none-any.whl?sig=a'b&x=$HOME;rm"),
])
def test_a_wheel_is_installed_with_the_machine_extras_exactly_as_given(install, requirement, tmp_path):
    calls = run_script(join_script(config(install=install), "head.internal:6380"), tmp_path)
    assert calls == [["python3", "-m", "pip", "install", requirement],
                     ["thrifty", "node", "join", "--address", "head.internal:6380"]]


def test_install_none_runs_nothing_but_setup_and_join(tmp_path):
    script = join_script(config(install="none", setup_commands=["true"]), "127.0.0.1:6379")
    assert install_command("none") is None
    assert run_script(script, tmp_path) == [["thrifty", "node", "join", "--address", "127.0.0.1:6379"]]


def test_the_heads_token_reaches_the_join_and_only_it(tmp_path):
    """The variables of the head's token are exported before ``thrifty node
    join`` (so ``ray start`` is let in), quoted, after the setup commands."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "thrifty").write_text(f"#!{sys.executable}\nimport json, os\n"
                                     "print(json.dumps({k: os.environ.get(k) for k in ('RAY_AUTH_MODE', "
                                     "'RAY_AUTH_TOKEN')}))\n")
    (bin_dir / "thrifty").chmod(0o755)
    token = "ab'c $HOME;x"
    script = join_script(config(install="none", setup_commands=["export RAY_AUTH_MODE=disabled"]),
                         "127.0.0.1:6379", env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    import json

    assert json.loads(done.stdout) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}


@pytest.mark.parametrize("address", ["10.0.0.5", "10.0.0.5:0", "10.0.0.5:65536", "head;reboot:6379", ":6379",
                                     "10.0.0.5:63a9"])
def test_join_script_refuses_a_bad_head_address(address):
    with pytest.raises(ProblemError, match="must be HOST:PORT"):
        join_script(config(), address, version="0.1.0")


def test_ray_start_patches_ray_for_a_loopback_head_only():
    resources = node_resources("i-0abc", "g4dn.xlarge", "spot")
    assert resources == {machine_resource("i-0abc"): 1.0, type_resource("g4dn.xlarge"): 1.0,
                         market_resource("spot"): 1.0}
    assert node_marks({**resources, "CPU": 4.0}) == ("i-0abc", "g4dn.xlarge", "spot")
    loopback = ray_start_command("127.0.0.1:6379", node_ip="127.0.0.1", resources=resources, num_cpus=2)
    remote = ray_start_command("10.0.0.5:6379", node_ip="10.0.0.7", resources=resources)
    assert "resolve_ip_for_localhost" in loopback[2] and "resolve_ip_for_localhost" not in remote[2]
    assert remote[3:] == ["start", "--address=10.0.0.5:6379", "--node-ip-address=10.0.0.7",
                          '--resources={"thrifty-machine:i-0abc": 1.0, "thrifty-market:spot": 1.0, '
                          '"thrifty-type:g4dn.xlarge": 1.0}']
    assert loopback[-1] == "--num-cpus=2" and not any(a.startswith("--num-gpus") for a in loopback)


def test_user_data_larger_than_ec2_takes_is_refused_before_anything_starts(moto):
    with pytest.raises(ProblemError, match="user data is 16385 bytes, but EC2 takes at most 16384"):
        Ec2Provider("big-run", config(), endpoint_url=moto.url, user_data="#" * 16385)


# -- thrifty node join: bad input --------------------------------------------------------------------------------

JOIN = ["node", "join", "--node-ip", "127.0.0.1", "--machine-id", "i-0abc", "--instance-type", "g4dn.xlarge",
        "--market", "spot"]


@pytest.mark.parametrize("argv, words", [
    (["node", "join"], "the following arguments are required: --address"),
    (["node", "join", "--address", "10.0.0.5"], "argument --address: address '10.0.0.5' must be HOST:PORT"),
    (JOIN + ["--address", "10.0.0.5:99999"], "a port in 1..65535"),
    (JOIN + ["--address", "10.0.0.5:6379", "--node-ip", "10.0.0"], "argument --node-ip: node IP '10.0.0' is not"),
    (JOIN + ["--address", "10.0.0.5:6379", "--machine-id", "i-0abc:x"], "argument --machine-id: machine id is "
                                                                          "'i-0abc:x', but must be"),
    (JOIN + ["--address", "10.0.0.5:6379", "--instance-type", "g4dn xlarge"], "argument --instance-type"),
    (JOIN + ["--address", "10.0.0.5:6379", "--market", "reserved"], "argument --market: invalid choice"),
    (JOIN + ["--address", "10.0.0.5:6379", "--num-cpus", "-1"], "argument --num-cpus: -1 must be at least 0"),
    (JOIN + ["--address", "10.0.0.5:6379", "--timeout", "0"], "argument --timeout: 0 must be a positive number"),
    (["node"], "the following arguments are required: ACTION"),
])
def test_node_join_refuses_bad_input_with_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert words in err and "Traceback" not in err


def test_node_join_without_a_metadata_service_says_what_to_give(capsys, monkeypatch):
    monkeypatch.setenv("THRIFTY_IMDS_URL", f"http://127.0.0.1:{free_port()}")
    assert main(["node", "join", "--address", "10.0.0.5:6379"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the metadata service" in err and "give --node-ip, --machine-id" in err
    assert "Traceback" not in err


def test_node_join_gives_up_on_a_head_that_never_answers(tmp_path, capsys):
    pytest.importorskip("ray", reason="Ray is not installed; `pip install 'thrifty[ray]'` runs this test")
    machine = f"i-{os.urandom(8).hex()}"
    started = time.monotonic()
    code = main(JOIN + ["--address", f"127.0.0.1:{free_port()}", "--machine-id", machine, "--timeout", "3",
                        "--log", str(tmp_path / "ray-start.log")])
    err = capsys.readouterr().err
    assert code == 1 and "did not join the cluster" in err and "within 3 s" in err
    assert time.monotonic() - started < 20
    leftovers = subprocess.run(["pgrep", "-f", "--", machine_resource(machine)], capture_output=True,
                               text=True).stdout.split()
    assert not leftovers, f"ray start left processes behind: {leftovers}"


# -- the harness: instances that join ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def moto():
    with moto_server() as server:
        yield server


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head on 127.0.0.1 with fast health checks, and this process its driver."""
    ray = pytest.importorskip("ray", reason="Ray is not installed; `pip install 'thrifty[ray]'` runs these tests")
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as mp:
        # Ray would rewrite 127.0.0.1 to this host's outbound IP, where a loopback head does not listen.
        mp.setattr(ray._private.services, "resolve_ip_for_localhost", lambda host: host)
        mp.delenv("RAY_ADDRESS", raising=False)
        cluster = Cluster(initialize_head=True, head_node_args={
            "node_ip_address": "127.0.0.1", "include_dashboard": False, "num_cpus": 1,
            "object_store_memory": OBJECT_STORE_BYTES, "_system_config": FAST_HEALTH_CHECKS})
        try:
            ray.init(address=cluster.address, _node_ip_address="127.0.0.1", log_to_driver=False,
                     configure_logging=False)
            # The tasks below travel by value: the nodes' workers cannot import this test module.
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
            yield cluster
        finally:
            ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
            ray.shutdown()
            cluster.shutdown()
            forget_address(cluster.address)


def forget_address(address: str) -> None:
    """Remove Ray's record of the latest cluster when it is this module's
    (stopped) head, so that no later ``ray.init()`` on this host looks for it."""
    from ray._common.utils import get_ray_address_file

    record = Path(get_ray_address_file(None))
    if record.exists() and record.read_text().strip() == address:
        record.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def two_machines(moto, ray_head, tmp_path_factory):
    """Two spot g4dn.xlarge launched with the join script, booted by the
    harness, joined: (provider, harness, {instance id: Ray node id})."""
    cfg = config(install="none", setup_commands=["echo booting $(hostname)"])
    with Ec2Harness(moto, tmp_path_factory.mktemp("instances"), run_id="join-run") as harness, \
            Ec2Provider("join-run", cfg, endpoint_url=moto.url,
                        user_data=join_script(cfg, ray_head.address)) as provider:
        harness.start()
        machines = provider.provision("g4dn.xlarge", 2, "spot")
        harness.wait_booted(2, JOIN_TIMEOUT_S)
        nodes = wait_for_nodes({m.id for m in machines}, JOIN_TIMEOUT_S)
        yield provider, harness, nodes
    assert not harness.errors


def wait_for_nodes(machine_ids: set[str], timeout_s: float) -> dict[str, str]:
    """{machine id: node id} once every machine's node is alive in the cluster."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        found = {node_marks(n["Resources"])[0]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        if machine_ids <= found.keys():
            return {m: found[m] for m in machine_ids}
        assert time.monotonic() < deadline, f"nodes joined: {sorted(found.keys() - {None})}, wanted {machine_ids}"
        time.sleep(0.1)


def where_am_i() -> tuple[str, str | None]:
    """(the node it runs on, THRIFTY_IMDS_URL there): a task."""
    import ray

    return ray.get_runtime_context().get_node_id(), os.environ.get("THRIFTY_IMDS_URL")


def spot_notice(instance_type: str, market: str, machine_id: str) -> dict | None:
    """The spot notice of the machine it runs on, or None: a task."""
    from thrifty.runtime.providers.imds import ImdsPoller

    event = ImdsPoller(instance_type, market, machine_id).check()  # the machine's own service, from the environment
    return None if event is None else json_object(event)


def on_machine(function, machine_id: str, *args):
    """Run `function` as a Ray task on the machine's node; its result."""
    import ray

    task = ray.remote(function).options(resources={machine_resource(machine_id): 0.01})
    return ray.get(task.remote(*args), timeout=JOIN_TIMEOUT_S)


def test_each_machine_joins_as_a_node_marked_with_its_id_type_and_market(two_machines):
    import ray

    provider, harness, nodes = two_machines
    by_id = {n["NodeID"]: n for n in ray.nodes()}
    for machine in provider.machines():
        node = by_id[nodes[machine.id]]
        assert node["Alive"] and node["NodeManagerAddress"] == "127.0.0.1"
        assert node_marks(node["Resources"]) == (machine.id, "g4dn.xlarge", "spot")
        assert node["Resources"]["CPU"] == 1.0  # the harness's small machines, not Ray's view of this host
        played = harness.played(machine.id)
        assert (played.folder / "user-data.sh").read_text() == provider.user_data  # what moto kept, as given
        assert "booting" in played.log.read_text()  # the setup commands ran first
        node_id, imds_url = on_machine(where_am_i, machine.id)
        assert node_id == nodes[machine.id]
        assert imds_url == harness.played(machine.id).imds.url


def test_a_spot_notice_reaches_a_task_on_that_machine_only(two_machines):
    provider, harness, nodes = two_machines
    first, second = sorted(nodes)
    assert on_machine(spot_notice, first, "g4dn.xlarge", "spot", first) is None
    at = harness.notice(first, in_s=120)
    event = on_machine(spot_notice, first, "g4dn.xlarge", "spot", first)
    assert (event["source"], event["machine_id"], event["market"]) == ("imds", first, "spot")
    assert event["time_left_s"] == pytest.approx(at - time.time(), abs=2.0)
    assert on_machine(spot_notice, second, "g4dn.xlarge", "spot", second) is None


def test_a_machine_taken_away_is_a_dead_node_and_a_preemption(two_machines):
    import ray

    provider, harness, nodes = two_machines
    first, second = sorted(nodes)
    harness.take_away(second, notice=False)
    killed_at = time.monotonic()
    while next(n for n in ray.nodes() if n["NodeID"] == nodes[second])["Alive"]:
        assert time.monotonic() - killed_at < 20, "Ray did not mark the killed node dead within 20 s"
        time.sleep(0.05)
    print(f"Ray marked the killed node dead after {time.monotonic() - killed_at:.2f} s")
    assert harness.raylet(second) is None and harness.node_processes(second) == []
    assert on_machine(where_am_i, first)[0] == nodes[first]  # the other machine works on
    deadline = time.monotonic() + 10
    events = []
    while not events and time.monotonic() < deadline:
        events = provider.poll_interruptions()
        time.sleep(0.05)
    assert [(e.machine_id, e.source) for e in events] == [(second, "describe")]


def test_close_gives_every_instance_back(two_machines, moto):
    provider, harness, nodes = two_machines
    provider.close()
    assert moto.live_instances() == []


def test_the_harness_cleans_up_after_itself(moto, tmp_path):
    """A harness closed while an instance's user data still runs stops it all."""
    slow = "#!/bin/bash\nsleep 300 &\ntouch started\nwait\n"
    with Ec2Provider("slow-run", config(), endpoint_url=moto.url, user_data=slow) as provider:
        with Ec2Harness(moto, tmp_path, run_id="slow-run") as harness:
            provider.provision("g4dn.xlarge", 1, "on_demand")
            (played,) = harness.play()
            assert played.market == "on_demand" and played.imds.items["instance-life-cycle"] == "on-demand"
            deadline = time.monotonic() + 10
            while not (played.folder / "started").exists():
                assert time.monotonic() < deadline, played.log_tail()
                time.sleep(0.02)
            # bash and its sleep; `touch` made the file before it exited, so on a loaded host it can still be
            # seen for a moment: wait for it to go
            pids = harness.node_processes(played.instance_id)
            while len(pids) != 2 and time.monotonic() < deadline:
                time.sleep(0.02)
                pids = harness.node_processes(played.instance_id)
            assert len(pids) == 2, pids
        assert played.process.poll() is not None
        assert harness.node_processes(played.instance_id) == []
    # its own instance: the module's moto server is shared, and what another test holds is that test's to check
    assert played.instance_id not in dict(moto.live_instances())


# shlex is the quoting the script uses; keep a reader's check of one line honest
def test_the_join_line_reads_back_with_shlex():
    line = join_script(config(install="none"), "10.0.0.5:6379").splitlines()[-1]
    assert shlex.split(line) == ["thrifty", "node", "join", "--address", "10.0.0.5:6379"]
