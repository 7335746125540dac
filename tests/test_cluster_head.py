"""`RayHead`: the Ray head a run from a cluster config starts for its
machines: a real ``ray start --head`` on 127.0.0.1 that admits only clients
with its token, refuses a busy port, and leaves nothing when stopped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("ray", reason="Ray is not installed; `pip install 'thrifty[ray]'` runs these tests")

from aws_fakes import free_port  # noqa: E402
from thrifty.core.errors import ProviderError  # noqa: E402
from thrifty.runtime.cluster.head import RayHead  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def gcs_processes(port: int) -> list[str]:
    return subprocess.run(["pgrep", "-f", f"gcs_server_port={port}"], capture_output=True, text=True).stdout.split()


def join_as(address: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A separate driver process joins the cluster with `env`'s credentials
    and prints how many nodes it sees."""
    code = ("import ray._private.services as s; s.resolve_ip_for_localhost = lambda h: h\n"
            "import ray\n"
            f"ray.init(address='{address}', _node_ip_address='127.0.0.1', log_to_driver=False)\n"
            "print('nodes', len(ray.nodes()))\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH") and k != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=90)


def test_a_head_admits_its_token_only_and_leaves_nothing(monkeypatch):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    port = free_port()
    head = RayHead("127.0.0.1", port)
    try:
        assert head.start() == f"127.0.0.1:{port}" and listening(port)
        assert os.environ["RAY_AUTH_TOKEN"] == head.auth_env["RAY_AUTH_TOKEN"]  # this driver is let in

        with pytest.raises(ProviderError, match="already listens"):
            RayHead("127.0.0.1", port).start()

        admitted = join_as(head.address, head.auth_env)
        assert "nodes 1" in admitted.stdout, admitted.stderr[-3000:]
        # a refused driver retries reading the session name (Ray's RAY_NUM_REDIS_GET_RETRIES, 20 by default,
        # about 30 s): a wrong token is refused on every try, so two tell the same and save the wait
        wrong = join_as(head.address, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64,
                                       "RAY_NUM_REDIS_GET_RETRIES": "2"})
        assert wrong.returncode != 0 and "nodes" not in wrong.stdout
    finally:
        head.stop()
    assert not listening(port) and gcs_processes(port) == []
    assert "RAY_AUTH_TOKEN" not in os.environ and "RAY_AUTH_MODE" not in os.environ  # put back as it was
    head.stop()  # again: nothing happens
