"""The Ray head a driver starts for machines that join it (issue "Run plans
across machines", part 3: "where the head runs").

A run from a cluster config (``--cluster cluster.yaml``) with no
``head_address`` owns its Ray cluster: the driver starts a head on its own
machine, the provider's machines join it from their user data
(`thrifty.runtime.cluster.bootstrap.join_script`), and the head goes when
the run ends. `RayHead` is that head: ``ray start --head --block`` as a child
process in a process group of its own, with no CPUs and no GPUs (nothing
but the driver's bookkeeping runs there; the workers run on the machines),
no dashboard, and the GCS on ``IP:PORT`` so that a security group can allow
it. ``--block`` keeps the command in the foreground, so the head's daemons
are the children of one process that this object stops: SIGTERM to the
group, then SIGKILL after a grace period. Ray's own fate sharing
(``--block`` starts a reaper) kills the daemons should the driver die
harder than that.

The head requires a token of every client (Ray's token authentication:
``RAY_AUTH_MODE=token``), a new random one per head, whatever Ray's default
for the host is (Ray 2.60 turns tokens on when ``~/.ray/auth_token``
exists, off otherwise). `auth_env` is what a process needs to be let in:
the head gets it in its environment, this driver process while the head
runs (`start` sets it, `stop` puts back what was there), and the machines
in their user data (`thrifty.runtime.cluster.bootstrap.join_script`).

The head binds to `ip`. A loopback IP (tests, where every machine is played
on this host) gets the same one-line patch that ``thrifty node join`` gives
``ray start`` (`thrifty.runtime.cluster.bootstrap.ray_start_command`): Ray
would otherwise rewrite 127.0.0.1 to the host's outbound address.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from thrifty.core.errors import ProviderError
from thrifty.core.optional import require
from thrifty.runtime.cluster.bootstrap import RayDaemons, ray_cli_code, start_ray_daemons

__all__ = ["RayHead", "default_head_ip"]

STOP_GRACE_S = 10.0


def default_head_ip() -> str:
    """This machine's address as Ray picks it for a node (the address of the
    interface that routes outward; no packet is sent)."""
    require("ray", "ray")
    import ray.util

    return str(ray.util.get_node_ip_address())


class RayHead:
    """``ray start --head`` on `ip`:`port` for the length of a run.

    `start` returns the GCS address once it accepts connections (within
    `timeout_s`; `ProviderError` otherwise, with the tail of the head's
    output, and nothing left running). `stop` is idempotent. Use it as a
    context manager or call both.
    """

    def __init__(self, ip: str, port: int, *, timeout_s: float = 60.0, log_path: Path | None = None,
                 system_config: dict[str, object] | None = None):
        self.ip, self.port, self.timeout_s = ip, port, timeout_s
        self.system_config = dict(system_config or {})
        self.log_path = log_path or Path(tempfile.gettempdir()) / f"thrifty-head-{ip}-{port}.log"
        self.process: RayDaemons[bytes] | None = None
        self.auth_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self._saved_env: dict[str, str | None] | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def command(self) -> list[str]:
        argv = [sys.executable, "-c", ray_cli_code(self.ip), "start", "--head", "--block",
                f"--node-ip-address={self.ip}", f"--port={self.port}", "--num-cpus=0", "--num-gpus=0",
                "--include-dashboard=false", "--disable-usage-stats"]
        if self.system_config:
            argv.append("--system-config=" + json.dumps(self.system_config, sort_keys=True))
        return argv

    def start(self) -> str:
        require("ray", "ray")
        if _listening(self.ip, self.port):
            raise ProviderError(f"something already listens on {self.address}: another Ray head? Give its address "
                                "as head_address in the cluster config to join it, or choose another ray_port")
        env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN_PATH"}
        with open(self.log_path, "wb") as log:
            self.process = start_ray_daemons(self.command(), log,
                                             {**env, **self.auth_env, "RAY_USAGE_STATS_ENABLED": "0"})
        self._saved_env = {k: os.environ.get(k) for k in (*self.auth_env, "RAY_AUTH_TOKEN_PATH")}
        os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
        os.environ.update(self.auth_env)
        _reload_auth()
        deadline = time.monotonic() + self.timeout_s
        while not _listening(self.ip, self.port):
            code = self.process.poll()
            if code is not None or time.monotonic() > deadline:
                self.stop()
                said = f"exited with {code}" if code is not None else f"did not listen within {self.timeout_s:g} s"
                raise ProviderError(f"the Ray head on {self.address} {said} (its output: {self.log_path}):\n"
                                    f"{_tail(self.log_path)}")
            time.sleep(0.2)
        return self.address

    def stop(self) -> None:
        saved, self._saved_env = self._saved_env, None
        for name, value in (saved or {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if saved is not None:
            _reload_auth()
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait()
        _signal_group(process.pid, signal.SIGKILL)  # whatever of the group outlived its leader

    def __enter__(self) -> RayHead:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _reload_auth() -> None:
    """Make this process's Ray see the authentication variables as they are
    now: Ray reads them into its configuration and caches the token when
    ``ray._raylet`` is first imported (what Ray's own token tests do to
    switch modes in one process)."""
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


def _listening(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"

