"""Plays the EC2 instances of a moto server on this host, as EC2 would boot
them: each instance that moto reports running gets its own IMDSv2 server
(`aws_fakes.ImdsServer`: its instance id, type and market, local-ipv4
127.0.0.1) and its user data, read back from moto, really runs under bash
with ``THRIFTY_IMDS_URL`` pointing at that server and this virtualenv's
``thrifty`` and ``ray`` first on PATH. A join script
(`thrifty.runtime.cluster.bootstrap.join_script`, with ``install: none``)
so makes every instance a Ray worker node on 127.0.0.1.

An instance can be taken away as EC2 takes a spot instance: `notice` posts
the two-minute spot notice on its metadata service, `kill_node` kills every
process of its Ray node (found by the session its user data ran in, or by
its ``THRIFTY_IMDS_URL``; the raylet is checked by its
``thrifty-machine:<id>`` resource), `terminate` terminates it in moto;
`take_away` does all three.

Instances boot one after the other: the next one's user data starts when
the previous one's has ended (or after `boot_timeout_s`). On EC2 every
machine has its own disk; here Ray's worker nodes share the head's session
directory on this host, and Ray picks its socket names there by looking for
a free one, which races between two ``ray start`` at once (a raylet dies
with "bind: Address already in use").

Each played machine is CPU-light: ``RAY_OVERRIDE_RESOURCES`` (Ray's own
override, which ``ray start`` reads) gives its node `cpus` CPUs and a small
object store. Linux only (it reads /proc). Everything the harness started
(bash, the Ray node processes, the metadata servers, the polling thread) is
stopped by `close`, which the context manager calls on every way out; the
instances themselves belong to whoever launched them.

Ray marks a killed node dead after its health checks fail: about 16 s with
Ray's defaults, about 1.5 s with a head started with `FAST_HEALTH_CHECKS` as
its ``_system_config``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aws_fakes import REGION, ImdsServer, MotoServer
from thrifty.runtime.cluster.resources import machine_resource

log = logging.getLogger("ec2_harness")

# The head's `_system_config` for fast death detection: a health check every
# 0.5 s, 1 s to answer, dead after 3 misses.
FAST_HEALTH_CHECKS = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                      "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray's floor is 75 MiB


@dataclass
class PlayedInstance:
    """One instance the harness booted: its metadata service, its user data
    (``user-data.sh``) and what running it printed (``user-data.log``)."""

    instance_id: str
    instance_type: str
    market: str
    imds: ImdsServer
    folder: Path
    process: subprocess.Popen[bytes] | None = None  # bash running the user data (None: it had none)
    killed: list[int] = field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.folder / "user-data.log"

    def booted(self, timeout_s: float = 60.0) -> int:
        """Wait until the user data has run; its exit status."""
        if self.process is None:
            return 0
        return self.process.wait(timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Ec2Harness:
    """Boots the running instances of `moto` (those tagged ``thrifty:run=<run_id>``
    when `run_id` is given) as this host's processes; logs under `folder`."""

    def __init__(self, moto: MotoServer, folder: Path, *, region: str = REGION, run_id: str | None = None,
                 cpus: int = 1, object_store_bytes: int = OBJECT_STORE_BYTES, boot_timeout_s: float = 60.0):
        self.moto, self.folder, self.region, self.run_id = moto, Path(folder), region, run_id
        self.cpus, self.object_store_bytes, self.boot_timeout_s = cpus, object_store_bytes, boot_timeout_s
        self._booting: subprocess.Popen[bytes] | None = None  # the user data that ran last
        self.instances: dict[str, PlayedInstance] = {}
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- booting ----------------------------------------------------------------------------------------------
    def play(self) -> list[PlayedInstance]:
        """One round: stop the nodes of instances that moto says ended (as EC2
        takes a terminated machine away), then boot every running instance not
        booted yet; the new ones."""
        ec2 = self.moto.client("ec2", self.region)
        self._play_terminations(ec2)
        filters = [{"Name": "instance-state-name", "Values": ["running"]}]
        if self.run_id is not None:
            filters.append({"Name": "tag:thrifty:run", "Values": [self.run_id]})
        reply = ec2.describe_instances(Filters=filters)
        booted = []
        for instance in (i for r in reply["Reservations"] for i in r["Instances"]):
            if instance["InstanceId"] in self.instances:
                continue
            self._previous_booted()
            with self._lock:
                if self._stop.is_set():
                    break
                played = self._boot(ec2, instance)
                self.instances[played.instance_id] = played
            booted.append(played)
        return booted

    def _play_terminations(self, ec2: Any) -> None:
        with self._lock:
            live = [i for i, p in self.instances.items() if p.process is not None and not p.killed]
        if not live:
            return
        reply = ec2.describe_instances(InstanceIds=live)
        for instance in (i for r in reply["Reservations"] for i in r["Instances"]):
            if instance["State"]["Name"] in ("shutting-down", "terminated"):
                played = self.instances[instance["InstanceId"]]
                pids = self.node_processes(played.instance_id)
                _kill(pids)
                played.killed.extend(pids or [-1])
                log.info("%s ended in moto: killed its node (%d processes)", played.instance_id, len(pids))

    def _previous_booted(self) -> None:
        if self._booting is None:
            return
        try:
            self._booting.wait(self.boot_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("user data pid %d still runs after %g s; booting the next instance", self._booting.pid,
                        self.boot_timeout_s)

    def start(self, interval_s: float = 0.2) -> "Ec2Harness":
        """Boot instances as they appear, every `interval_s`, in a thread
        (a failed round is kept in `errors` and the next round goes on)."""
        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.play()
                except Exception as e:  # noqa: BLE001 -- reported through `errors`, the thread goes on
                    log.exception("a round of the EC2 harness failed")
                    self.errors.append(e)

        self._thread = threading.Thread(target=loop, name="ec2-harness", daemon=True)
        self._thread.start()
        return self

    def wait_booted(self, count: int, timeout_s: float = 60.0) -> list[PlayedInstance]:
        """Wait until `count` instances have been booted and their user data has
        run to the end successfully (AssertionError with its output otherwise)."""
        deadline = time.monotonic() + timeout_s
        while len(self.instances) < count:
            if self._thread is None:
                self.play()
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.instances)} of {count} instances booted after {timeout_s:g} s")
            time.sleep(0.1)
        played = list(self.instances.values())
        for p in played:
            code = p.booted(max(1.0, deadline - time.monotonic()))
            assert code == 0, f"the user data of {p.instance_id} exited with {code}:\n{p.log_tail()}"
        return played

    def _boot(self, ec2: Any, instance: dict[str, Any]) -> PlayedInstance:
        instance_id = instance["InstanceId"]
        market = "spot" if instance.get("InstanceLifecycle") == "spot" else "on-demand"
        imds = ImdsServer(instance_id, local_ipv4="127.0.0.1", instance_type=instance["InstanceType"],
                          life_cycle=market).start()
        folder = self.folder / instance_id
        folder.mkdir(parents=True, exist_ok=True)
        played = PlayedInstance(instance_id, instance["InstanceType"], market.replace("-", "_"), imds, folder)
        reply = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        encoded = reply.get("UserData", {}).get("Value")
        if not encoded:
            return played
        script = folder / "user-data.sh"
        script.write_bytes(base64.b64decode(encoded))
        with open(played.log, "wb") as out:
            # Its own session, as a machine of its own: everything the script starts stays in it.
            played.process = subprocess.Popen(["bash", str(script)], cwd=folder, stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT, env=self._env(imds), start_new_session=True)
        self._booting = played.process
        log.info("booted %s (%s, %s): user data running as pid %d", instance_id, played.instance_type, market,
                 played.process.pid)
        return played

    def _env(self, imds: ImdsServer) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
        venv_bin = os.path.dirname(sys.executable)  # not resolved: a virtualenv's python is a link
        env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "")
        env["THRIFTY_IMDS_URL"] = imds.url
        env["RAY_OVERRIDE_RESOURCES"] = json.dumps({"CPU": self.cpus, "object_store_memory": self.object_store_bytes})
        return env

    # -- taking an instance away ----------------------------------------------------------------------------
    def played(self, instance_id: str) -> PlayedInstance:
        try:
            return self.instances[instance_id]
        except KeyError:
            raise AssertionError(f"{instance_id} was not booted by the harness "
                                 f"(booted: {sorted(self.instances)})") from None

    def notice(self, instance_id: str, action: str = "terminate", in_s: float = 120.0) -> float:
        """Post a spot notice on the instance's metadata service; its time."""
        return self.played(instance_id).imds.interrupt(action, in_s)

    def node_processes(self, instance_id: str) -> list[int]:
        """Pids of the instance's Ray node and user data: the processes in the
        session its user data ran in, and those whose environment names its
        metadata service (in case one left the session)."""
        played = self.played(instance_id)
        if played.process is None:
            return []
        marker = f"THRIFTY_IMDS_URL={played.imds.url}".encode()
        found = []
        for pid in _pids():
            try:
                if (os.getsid(pid) == played.process.pid or marker in _environ(pid)) and not _zombie(pid):
                    found.append(pid)
            except (ProcessLookupError, PermissionError):
                continue
        return found

    def raylet(self, instance_id: str) -> int | None:
        """The pid of the instance's raylet: the process whose command line
        carries its ``thrifty-machine:<id>`` resource."""
        resource = machine_resource(instance_id).encode()
        for pid in self.node_processes(instance_id):
            cmdline = _cmdline(pid)
            if b"raylet" in cmdline.split(b"\0")[0] and resource in cmdline:
                return pid
        return None

    def kill_node(self, instance_id: str) -> list[int]:
        """SIGKILL every process of the instance's node, as a machine that
        vanished; the pids killed (the raylet among them, else AssertionError)."""
        raylet = self.raylet(instance_id)
        assert raylet is not None, f"no raylet with {machine_resource(instance_id)} runs for {instance_id}"
        pids = self.node_processes(instance_id)
        _kill(pids)
        self.played(instance_id).killed.extend(pids)
        return pids

    def terminate(self, instance_id: str) -> None:
        self.moto.client("ec2", self.region).terminate_instances(InstanceIds=[instance_id])

    def take_away(self, instance_id: str, *, notice: bool = True, kill: bool = True, terminate: bool = True) -> None:
        """Do to an instance what EC2 does to a reclaimed spot instance."""
        if notice:
            self.notice(instance_id)
        if kill:
            self.kill_node(instance_id)
        if terminate:
            self.terminate(instance_id)

    # -- cleaning up --------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop everything the harness started, whatever happened before."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            played = list(self.instances.values())
        for p in played:
            try:
                if p.process is not None:
                    _kill(self.node_processes(p.instance_id), wait_s=10)
                    try:
                        p.process.wait(10)
                    except subprocess.TimeoutExpired:
                        p.process.kill()
                        p.process.wait(5)
            finally:
                p.imds.close()
                # where `thrifty node join` writes ray start's output by default
                (Path(tempfile.gettempdir()) / f"thrifty-node-{p.instance_id}.log").unlink(missing_ok=True)

    def __enter__(self) -> "Ec2Harness":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != os.getpid()]


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return b""


def _cmdline(pid: int) -> bytes:
    return _read(f"/proc/{pid}/cmdline")


def _environ(pid: int) -> bytes:
    return _read(f"/proc/{pid}/environ")


def _zombie(pid: int) -> bool:
    """A process that has ended but was not waited for (its parent's to reap)."""
    stat = _read(f"/proc/{pid}/stat")
    return not stat or stat.rsplit(b")", 1)[1].split()[0] == b"Z"


def _kill(pids: list[int], wait_s: float = 0.0) -> None:
    """SIGKILL `pids`; with `wait_s`, wait up to that long until each has
    ended (gone, or a zombie): a killed process ends only once the kernel
    schedules it again, which on a loaded host can be after the caller has
    looked."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while any(not _zombie(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)
