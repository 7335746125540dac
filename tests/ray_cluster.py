"""A three-node Ray cluster on this host for the cluster tests and
benchmarks: every node bound to 127.0.0.1 (`ray.cluster_utils.Cluster`), each
with its own local IMDSv2 server (``THRIFTY_IMDS_URL`` in the node's
environment), so spot notices can be posted per node and removing a node is
the preemption."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aws_fakes import ImdsServer

from thrifty.runtime.cluster.connect import keep_loopback

NODE = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "object_store_memory": 80 * 2**20}
SPOT_A = {"thrifty-type:local-a": 1, "thrifty-market:spot": 1}


class ThreeNodes:
    """A head and two nodes: the head and `spare` are local-a spot machines,
    `other` a local-b on-demand one; each node has its own metadata service,
    and `env` (such as the AWS configuration a machine reaches S3 with) in
    its environment."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        from ray.cluster_utils import Cluster

        keep_loopback()
        self.env = dict(env or {})
        self.imds: dict[str, ImdsServer] = {}
        self.cluster = Cluster(initialize_head=True, head_node_args={
            **NODE, "include_dashboard": False, "resources": SPOT_A, "env_vars": self._imds("head")})
        self.spare = self.other = None
        self.refill()

    def _imds(self, name: str) -> dict[str, str]:
        if name in self.imds:
            self.imds[name].close()
        server = self.imds[name] = ImdsServer(f"i-{name}").start()
        return {**self.env, "THRIFTY_IMDS_URL": server.url}

    def refill(self) -> None:
        """Bring the cluster back to three live nodes."""
        if self.spare is None:
            self.spare = self.cluster.add_node(**NODE, resources=SPOT_A, env_vars=self._imds("spare"))
        if self.other is None:
            self.other = self.cluster.add_node(**NODE, resources={"thrifty-type:local-b": 1},
                                               env_vars=self._imds("other"))
        self.cluster.wait_for_nodes()

    def remove_spare(self) -> None:
        node, self.spare = self.spare, None
        self.cluster.remove_node(node)

    def close(self) -> None:
        self.cluster.shutdown()
        for server in self.imds.values():
            server.close()

    def lend(self, provider):
        """For a test's fixture (``yield from nodes.lend(provider)``): `provider`, shared by the tests of a
        module or class, holding no machine, with the cluster back at three nodes (a test removes one) and
        an agent warm on each; what the test left held is given back after it, as closing a provider does."""
        self.refill()
        self.warm(provider)
        assert provider.machines() == []
        yield provider
        provider.terminate(provider.machines())

    def warm(self, provider) -> None:
        """Start `provider`'s agent on each of the three nodes and wait for its fork server (torch
        imported), then give the machines back: the agents stay, and the run's first launch on them
        is as quick as a re-plan's. Cold, each of the three agents and fork servers on this one host
        import Ray and torch at once: about 3 s of CPU each, a 20 s launch on a loaded 2-core host,
        which the driver would then also charge to every re-plan's switch."""
        import ray

        machines = provider.provision("local-a", 2, "spot") + provider.provision("local-b", 1, "on_demand")
        ray.get([provider.agent(m.id).ready.remote() for m in machines], timeout=300)
        provider.terminate(machines)


# -- a cluster started with `ray start`, as a user starts one ---------------------------------------------------

# `ray`, Ray's own command line, run by this Python (the environment thrifty is installed in, which the nodes'
# workers then run): what the console script does.
RAY_CLI = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"]


def free_port() -> int:
    """A TCP port nothing listens on now (from the ephemeral range, so never one of Ray's worker ports,
    10002-19999 by default)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RayStartCluster:
    """A Ray cluster started with the ``ray`` command line the way the README
    says (``ray start --head --node-ip-address=127.0.0.1 --port=PORT``, then
    ``ray start --address=127.0.0.1:PORT --node-ip-address=127.0.0.1`` per
    node, each with its thrifty resources), with its own temporary folder and
    free ports for everything Ray would otherwise put on a fixed port
    (8265, 10001, 52365...), so it shares nothing with another test's cluster.

    `close` stops this cluster only (``ray stop`` would stop every Ray on the
    host): each ``ray start`` runs in a process group of its own, which Ray's
    daemons and workers inherit, so the cluster is those groups, plus
    anything whose command line names its temporary folder.

    The cluster requires a token of its own (`env`: ``RAY_AUTH_MODE=token``
    and ``RAY_AUTH_TOKEN``, what a process needs to join it), so that it does
    not depend on ``~/.ray/auth_token``, which any local ``ray.init()`` on
    the host creates, and with which Ray 2.60 turns tokens on for a head
    (``ray start --head``) but not for a node joining it by its address.
    """

    def __init__(self, root: Path, nodes: list[dict[str, float]], *, num_cpus: int = 1,
                 timeout_s: float = 180.0) -> None:
        self.root = root
        # Ray's socket paths (TEMP/session_<date>_<pid>/sockets/plasma_store.1) must fit in 107 bytes: a short
        # folder of /tmp, not one under pytest's deep temporary folders
        self.temp_dir = Path(tempfile.mkdtemp(prefix="thrifty-ray-", dir="/tmp"))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.groups: list[int] = []
        self.timeout_s = timeout_s
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        try:
            for k, resources in enumerate(nodes):
                self._start(k, resources, num_cpus)
        except BaseException:
            self.close()
            raise

    def _start(self, k: int, resources: dict[str, float], num_cpus: int) -> None:
        argv = [*RAY_CLI, "start", "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}",
                f"--object-store-memory={80 * 2**20}", f"--resources={json.dumps(resources)}",
                f"--temp-dir={self.temp_dir}", "--disable-usage-stats",
                f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                f"--runtime-env-agent-port={free_port()}", f"--metrics-export-port={free_port()}"]
        if k == 0:
            argv += ["--head", f"--port={self.port}", "--include-dashboard=false",
                     f"--dashboard-port={free_port()}"]
        else:
            argv += [f"--address={self.address}"]
        log = self.root / f"ray-start-{k}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       process_group=0, env=self.process_env())
        self.groups.append(process.pid)
        code = process.wait(self.timeout_s)
        if code != 0:
            raise RuntimeError(f"ray start (node {k}) exited with {code}:\n{log.read_text()[-3000:]}")

    def process_env(self) -> dict[str, str]:
        """The environment of a process that joins this cluster (and of its nodes)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
        return {**env, **self.env, "RAY_USAGE_STATS_ENABLED": "0"}

    def processes(self) -> list[int]:
        """The pids of this cluster's processes still alive."""
        mine = []
        marker = str(self.temp_dir).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                pgid = os.getpgid(int(entry.name))
                cmdline = (entry / "cmdline").read_bytes()
                zombie = (entry / "stat").read_text().rpartition(")")[2].split()[0] == "Z"
            except (OSError, IndexError):
                continue
            if not zombie and (pgid in self.groups or marker in cmdline):
                mine.append(int(entry.name))
        return mine

    def close(self, grace_s: float = 10.0) -> None:
        """SIGTERM to every process of this cluster, SIGKILL to what is left after `grace_s`."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.processes():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.2)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
