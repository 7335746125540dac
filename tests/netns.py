"""Separate network stacks on one host, for tests: Linux network namespaces
joined by a bridge, and a Ray cluster with one node in each.

``NetnsNetwork(3)`` creates the namespaces ``thrifty-t<pid>-0`` .. ``-2``, each
with one veth interface (``thrifty<i>``) carrying an address that exists only
inside it, the other ends on a bridge that lives in a namespace of its own
(``thrifty-t<pid>-br``): the host's root namespace gets no link, address or
route, so traffic between the namespaces never touches the host's stack, and
nothing in a namespace can reach 127.0.0.1 of another, nor the host. ``lo``
is up in each (Ray's processes talk to each other on it). Commands run inside
through ``ip netns exec``, under a small subreaper (this file run as a script)
that collects whatever they daemonize, so a killed Ray node leaves no zombie.
``close()`` (and leaving the ``with`` block, also on an exception or
KeyboardInterrupt) kills every process in the namespaces, deletes them and
removes the working folder; ``leftovers()`` says what, if anything, survived.

``RayCluster(network, machines)`` starts a Ray head in namespace 0 and a
worker node in each other one. Node ``i`` is marked as thrifty machine
``n<i>`` of the instance type and market that ``machines[i]`` names (the
resources ``thrifty-machine:n<i>``, ``thrifty-type:<type>`` and
``thrifty-market:<market>``, which `thrifty.runtime.cluster.provider.RayProvider`
reads). A driver runs in namespace 0 (``cluster.run_driver``).

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's ``ip``;
``unavailable_reason()`` says why not, for a skip.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

PREFIX = "thrifty-t"
# Tried in order; the first that overlaps no address or route of the host's root namespace is
# used. (The namespaces are isolated, so a clash would not misroute anything; a distinct range only
# keeps addresses in logs unambiguous.)
SUBNETS = ("10.213.0.0/24", "10.231.0.0/24", "172.30.213.0/24")
# What an `ip` failure says when the kernel or the sandbox does not allow the namespaces: a skip,
# not a failure.
_UNAVAILABLE = re.compile(r"Operation not permitted|Permission denied|Unknown device type|not supported",
                          re.IGNORECASE)
_STALE = re.compile(r"^" + re.escape(PREFIX) + r"(\d+)-")
_PR_SET_CHILD_SUBREAPER = 36


class NetnsError(RuntimeError):
    """A namespace, link or process could not be set up or taken down."""


class NetnsUnavailable(NetnsError):
    """This host does not let the tests create network namespaces."""


# -- small pure helpers -----------------------------------------------------------------------------------


def interface_carrying(address: str, interfaces: Mapping[str, Iterable[Any]]) -> str:
    """The name of the interface that carries ``address``.

    ``interfaces`` is shaped as ``psutil.net_if_addrs()`` returns it: a name to
    entries with an ``.address`` (IPv6 link-local ones may end in ``%zone``).
    This is the interface to hand to gloo (``GLOO_SOCKET_IFNAME``) or NCCL
    (``NCCL_SOCKET_IFNAME``) so that a rank binds to its node's address.
    Raises LookupError when no interface, or more than one, carries it.
    """
    wanted = ipaddress.ip_address(address)
    carriers = []
    for name, entries in interfaces.items():
        for entry in entries:
            try:
                if ipaddress.ip_address(str(entry.address).split("%", 1)[0]) == wanted:
                    carriers.append(name)
                    break
            except ValueError:  # a MAC address (AF_PACKET)
                continue
    if len(carriers) != 1:
        seen = sorted(interfaces)
        raise LookupError(f"address {address} is carried by {len(carriers)} interfaces {sorted(carriers)}, "
                          f"but must be carried by exactly one (interfaces: {seen})")
    return carriers[0]


def free_subnet(candidates: Sequence[str], taken: Iterable[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first of ``candidates`` that overlaps none of ``taken``."""
    taken = list(taken)
    for candidate in candidates:
        network = ipaddress.IPv4Network(candidate)
        if not any(network.overlaps(other) for other in taken):
            return network
    raise NetnsError(f"every candidate subnet {list(candidates)} overlaps the host's networks "
                     f"{[str(t) for t in taken]}; pass subnet= one that does not")


def stale_names(names: Iterable[str], pid_alive: Callable[[int], bool]) -> list[str]:
    """Those of ``names`` (namespaces or /tmp folders) that a test run whose
    process is gone left behind: ``thrifty-t<pid>-...`` with ``pid`` dead."""
    stale = []
    for name in names:
        match = _STALE.match(name)
        if match and not pid_alive(int(match.group(1))):
            stale.append(name)
    return stale


# -- the host -----------------------------------------------------------------------------------------------


def ip_binary() -> str | None:
    """iproute2's ``ip``, also where a non-root PATH leaves out /sbin."""
    return shutil.which("ip", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be used here, or None. (Whether the
    kernel lets us create one is known only by trying: ``NetnsNetwork`` then
    raises NetnsUnavailable.)"""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run the tests as root"
    if ip_binary() is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = ip_binary()
    if binary is None:
        raise NetnsUnavailable(unavailable_reason() or "`ip` is missing")
    result = subprocess.run([binary, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    if check and result.returncode != 0:
        message = f"`ip {' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}"
        raise (NetnsUnavailable if _UNAVAILABLE.search(result.stderr) else NetnsError)(message)
    return result


def list_namespaces() -> list[str]:
    """Names of the host's named network namespaces (``ip netns list``)."""
    return [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]


def namespace_pids(name: str) -> list[int]:
    """Pids of the live processes in namespace ``name`` (``ip netns pids``); [] if it is gone."""
    result = _ip("netns", "pids", name, check=False)
    return [int(p) for p in result.stdout.split() if p.isdigit() and not _zombie(int(p))]


def host_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks the host's root namespace has addresses or routes in."""
    networks = []
    for entry in json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]"):
        for info in entry.get("addr_info", []):
            networks.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        destination = route.get("dst", "")
        if destination and destination != "default":
            try:
                networks.append(ipaddress.IPv4Network(destination, strict=False))
            except ValueError:  # a multicast or broadcast name
                continue
    return networks


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def processes_with_marker(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (``NAME=value``)."""
    wanted = marker.encode()
    return [int(p) for p in os.listdir("/proc")
            if p.isdigit() and int(p) != os.getpid() and _environ_has(int(p), wanted) and not _zombie(int(p))]


def kill_namespace_processes(names: Sequence[str], *, spare: Iterable[int] = (), grace_s: float = 3.0,
                             give_up_s: float = 20.0) -> None:
    """SIGTERM every process in the namespaces ``names`` (but ``spare``), then
    SIGKILL what is left after ``grace_s``, until none is left."""
    spared = set(spare)
    start = time.monotonic()
    while True:
        pids = [p for name in names for p in namespace_pids(name) if p not in spared]
        if not pids:
            return
        waited = time.monotonic() - start
        if waited > give_up_s:
            raise NetnsError(f"processes {pids} in {list(names)} survive SIGKILL after {give_up_s:.0f} s")
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM if waited < grace_s else signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def remove_stale(tmp: str = "/tmp") -> list[str]:
    """Delete the namespaces and /tmp folders that earlier runs, whose
    processes are gone, left behind (a crash, a SIGKILL); what was removed."""
    namespaces = stale_names(list_namespaces(), _pid_alive)
    kill_namespace_processes(namespaces, grace_s=0.0)
    for name in namespaces:
        _ip("netns", "del", name, check=False)
    folders = stale_names(os.listdir(tmp), _pid_alive)
    for folder in folders:
        shutil.rmtree(os.path.join(tmp, folder), ignore_errors=True)
    return namespaces + [os.path.join(tmp, f) for f in folders]


# -- processes in a namespace ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One namespace of a network: its index, name, address and interface."""
    index: int
    namespace: str
    address: str
    interface: str


@dataclass(frozen=True)
class Result:
    """A command that ran to its end in a namespace."""
    returncode: int
    output: str  # stdout and stderr, interleaved
    log: Path


class NetnsProcess:
    """A command started in a namespace under the subreaper.

    ``returncode()`` is the command's own exit status, known as soon as it
    exits, even while what it daemonized runs on (``ray start``); the
    subreaper (``popen``) exits once all of that is gone."""

    def __init__(self, popen: subprocess.Popen[bytes], log: Path, status: Path, argv: Sequence[str]):
        self.popen = popen
        self.log = log
        self.status = status
        self.argv = list(argv)

    def returncode(self) -> int | None:
        try:
            return int(self.status.read_text())
        except (FileNotFoundError, ValueError):
            if self.popen.poll() is not None and not self.status.exists():
                return self.popen.returncode  # the subreaper itself failed
            return None

    def wait(self, timeout: float) -> int:
        """The command's exit status; NetnsError with its log's tail if it runs past ``timeout``."""
        deadline = time.monotonic() + timeout
        while (code := self.returncode()) is None:
            if time.monotonic() > deadline:
                raise NetnsError(f"{self.argv[:4]}... still runs after {timeout:.0f} s; its log ends:\n"
                                 f"{self.tail()}")
            time.sleep(0.05)
        return code

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-lines:])


class _Opened:
    """A ``with`` block opens it (`_open`; what a failed open made is closed)
    and closes it (`close`), also on an exception or KeyboardInterrupt."""

    def _open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self._open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


class NetnsNetwork(_Opened):
    """``size`` network namespaces on one bridge; see the module docstring.

    Members are ``members[i]``: namespace ``thrifty-t<pid>-<i>``, address the
    subnet's host ``i + 1`` (``10.213.0.1`` ...), interface ``thrifty<i>``.
    ``work_dir`` (under /tmp, short: Ray's unix socket paths must stay under
    107 bytes) holds the logs and whatever a user puts there; it is removed
    on close.
    """

    def __init__(self, size: int = 3, *, subnet: str | None = None, tmp: str = "/tmp"):
        if not 1 <= size <= 16:
            raise ValueError(f"`size` is {size}, but must be between 1 and 16")
        self.size = size
        self._subnet = subnet
        self._tmp = tmp
        base = f"{PREFIX}{os.getpid()}"
        self.bridge_namespace = f"{base}-br"
        self.names = [f"{base}-{i}" for i in range(size)]
        self.members: tuple[Member, ...] = ()
        self.work_dir = Path()
        # every process started in the namespaces carries this in its environment, its descendants too
        self.marker = ""
        self._processes: list[NetnsProcess] = []
        self._created: list[str] = []
        self._closed = False

    # -- life cycle --
    def _open(self) -> None:
        taken = [n for n in self.names + [self.bridge_namespace] if n in list_namespaces()]
        if taken:
            raise NetnsError(f"namespaces {taken} exist already: this process made them and did not close them")
        subnet = ipaddress.IPv4Network(self._subnet) if self._subnet else free_subnet(SUBNETS, host_networks())
        hosts = list(subnet.hosts())
        if len(hosts) < self.size:
            raise ValueError(f"subnet {subnet} has {len(hosts)} host addresses, but {self.size} are needed")
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self._tmp))
        (self.work_dir / "logs").mkdir()
        self.marker = f"THRIFTY_NETNS={self.work_dir}"
        self.members = tuple(Member(i, name, str(hosts[i]), f"thrifty{i}") for i, name in enumerate(self.names))

        bridge = self.bridge_namespace
        self._add_namespace(bridge)
        _ip("-n", bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", bridge, "link", "set", "br0", "up")
        for m in self.members:
            self._add_namespace(m.namespace)
            # both ends are made inside namespaces: the root namespace never sees the link
            _ip("-n", bridge, "link", "add", f"v{m.index}", "type", "veth",
                "peer", "name", m.interface, "netns", m.namespace)
            _ip("-n", bridge, "link", "set", f"v{m.index}", "master", "br0", "up")
            _ip("-n", m.namespace, "addr", "add", f"{m.address}/{subnet.prefixlen}", "dev", m.interface)
            _ip("-n", m.namespace, "link", "set", m.interface, "up")
            _ip("-n", m.namespace, "link", "set", "lo", "up")
        self.check_connectivity()

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)

    def close(self) -> None:
        """Kill every process in the namespaces, delete them and the work
        folder. Idempotent; SIGINT waits until it is done (main thread)."""
        if self._closed:
            return
        with _sigint_deferred():
            errors = []
            try:
                kill_namespace_processes(self._created, spare=self.reaper_pids())
            except NetnsError as e:
                errors.append(str(e))
            for process in self._processes:  # the subreapers end once their children are gone
                try:
                    process.popen.wait(5)
                except subprocess.TimeoutExpired:
                    process.popen.kill()
                    process.popen.wait(5)
            for name in reversed(self._created):
                result = _ip("netns", "del", name, check=False)
                if result.returncode != 0 and name in list_namespaces():
                    errors.append(f"`ip netns del {name}`: {result.stderr.strip()}")
            if self.work_dir != Path():
                shutil.rmtree(self.work_dir, ignore_errors=True)
            self._closed = True
            if errors:
                raise NetnsError("; ".join(errors))

    def leftovers(self) -> list[str]:
        """What of this network is still there: namespaces, processes, the work folder."""
        found = [f"namespace {n}" for n in list_namespaces() if n in self.names + [self.bridge_namespace]]
        if self.marker:
            for pid in processes_with_marker(self.marker):
                found.append(f"process {pid} ({_command_line(pid)[:120]})")
        if self.work_dir != Path() and self.work_dir.exists():
            found.append(f"folder {self.work_dir}")
        return found

    # -- inside --
    def command(self, index: int, argv: Sequence[str]) -> list[str]:
        """``argv`` as it runs inside member ``index``'s namespace."""
        return [ip_binary() or "ip", "netns", "exec", self.members[index].namespace, *argv]

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """This process's environment without any RAY_* setting (a cluster in
        the namespaces is configured only by what its starter passes), with the
        marker, the Python running the tests first on PATH, and ``extra``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        name, value = self.marker.split("=", 1)
        env[name] = value
        env.update(extra or {})
        return env

    def spawn(self, index: int, argv: Sequence[str], *, name: str, env: Mapping[str, str] | None = None,
              cwd: str | Path | None = None) -> NetnsProcess:
        """Start ``argv`` in member ``index``'s namespace, its output in
        ``work_dir/logs/<name>.log`` (a file, never a pipe: what a command
        daemonizes keeps a pipe open), in a session of its own (so no signal to
        the tests' process group reaches it), under the subreaper."""
        if self._closed or not self.members:
            raise NetnsError("the network is not open")
        log = self.work_dir / "logs" / f"{name}.log"
        status = self.work_dir / "logs" / f"{name}.status"
        if log.exists():
            raise ValueError(f"`name` is {name!r}, but a process of that name was started already")
        reaper = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(status), "--", *argv]
        with open(log, "wb") as out:
            popen = subprocess.Popen(self.command(index, reaper), stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, env=self.environment(env), cwd=cwd,
                                     start_new_session=True)
        process = NetnsProcess(popen, log, status, argv)
        self._processes.append(process)
        return process

    def run(self, index: int, argv: Sequence[str], *, name: str, timeout: float,
            env: Mapping[str, str] | None = None, cwd: str | Path | None = None) -> Result:
        """Run ``argv`` to its end in member ``index``'s namespace. Past
        ``timeout``, its session is killed and NetnsError says so."""
        process = self.spawn(index, argv, name=name, env=env, cwd=cwd)
        try:
            code = process.wait(timeout)
        except NetnsError:
            _kill_session(process.popen.pid)
            raise
        return Result(code, process.output(), process.log)

    def pids(self, index: int) -> list[int]:
        """Pids of the live processes in member ``index``'s namespace."""
        return namespace_pids(self.members[index].namespace)

    def reaper_pids(self) -> list[int]:
        """Pids of the subreapers of the commands spawned so far."""
        return [p.popen.pid for p in self._processes]

    def check_connectivity(self) -> None:
        """Each namespace reaches its own 127.0.0.1 and every other member's
        address (a TCP connect to a closed port is refused by the peer's kernel,
        which proves the path), or NetnsError."""
        failures = []
        for m in self.members:
            targets = ["127.0.0.1"] + [o.address for o in self.members if o.index != m.index]
            result = self.run(m.index, [sys.executable, "-I", "-S", "-c", _CONNECT_CHECK, *targets],
                              name=f"connectivity-{m.index}", timeout=30)
            if result.returncode != 0:
                failures.append(f"from {m.namespace} ({m.address}): {result.output.strip()}")
        if failures:
            raise NetnsError("namespaces cannot reach each other:\n" + "\n".join(failures))


_CONNECT_CHECK = """
import socket, sys
bad = []
for address in sys.argv[1:]:
    with socket.socket() as s:
        s.settimeout(5)
        try:
            s.connect((address, 9))
        except ConnectionRefusedError:
            pass
        except OSError as e:
            bad.append(f"{address}: {e}")
print("; ".join(bad))
sys.exit(1 if bad else 0)
"""


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _kill_session(session: int) -> None:
    """SIGKILL every process of session ``session`` (a spawned command's)."""
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.getsid(int(p)) == session:
                    os.kill(int(p), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue


class _sigint_deferred:
    """Hold a Ctrl-C that comes during clean-up until clean-up is done."""

    def __enter__(self) -> None:
        self.caught: list[int] = []
        self.previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, lambda signum, frame: self.caught.append(signum))

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
            if self.caught:
                raise KeyboardInterrupt


# -- Ray in the namespaces ------------------------------------------------------------------------------------


class RayCluster(_Opened):
    """A Ray node in each namespace of ``network``: the head in member 0.

    Each node has its own Ray temp dir (``work_dir/ray<i>``, by ``--temp-dir``
    and ``RAY_TMPDIR``): the namespaces share one filesystem, and nodes that
    share a temp dir share a session folder and the socket names in it. Each
    node has ``num_cpus`` CPUs, ``object_store_bytes`` of object store and
    the marks of thrifty machine ``machine_id(i)`` = ``n<i>`` of the
    ``(instance type, market)`` ``machines[i]`` (by default ``local-a`` on
    demand), among them ``resource(i)`` = ``thrifty-machine:n<i>``. Ports need no
    care: each namespace has its own. The cluster uses token authentication
    with a token of its own (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``),
    so nothing else on the host can join it, and no ``~/.ray/auth_token``
    changes what it does.
    """

    def __init__(self, network: NetnsNetwork, machines: Sequence[tuple[str, str]] | None = None, *,
                 port: int = 6379, num_cpus: int = 1, object_store_bytes: int = 80_000_000,
                 start_timeout_s: float = 90.0):
        machines = list(machines) if machines is not None else [("local-a", "on_demand")] * network.size
        if len(machines) != network.size:
            raise ValueError(f"`machines` has {len(machines)} entries, but the network has {network.size} members")
        self.network = network
        self.machines = machines
        self.port = port
        self.num_cpus = num_cpus
        self.object_store_bytes = object_store_bytes
        self.start_timeout_s = start_timeout_s
        self._token = secrets.token_hex(32)
        self._started = False
        self._closed = False

    @property
    def address(self) -> str:
        """The head's GCS address, ``10.213.0.1:6379``."""
        return f"{self.network.members[0].address}:{self.port}"

    @staticmethod
    def machine_id(index: int) -> str:
        """The thrifty machine that member ``index``'s node is."""
        return f"n{index}"

    @classmethod
    def resource(cls, index: int) -> str:
        """The custom resource that marks member ``index``'s node as its machine."""
        # imported here, not at the top: the subreaper runs this file with `python -I -S`, without thrifty
        from thrifty.runtime.cluster.resources import machine_resource

        return machine_resource(cls.machine_id(index))

    def marks(self, index: int) -> dict[str, float]:
        """The custom resources of member ``index``'s node."""
        from thrifty.runtime.cluster.resources import node_resources

        return node_resources(self.machine_id(index), *self.machines[index])

    def temp_dir(self, index: int) -> Path:
        return self.network.work_dir / f"ray{index}"

    def environment(self, index: int) -> dict[str, str]:
        """What a Ray process (a node or a driver) in member ``index`` needs in its environment."""
        return {"RAY_TMPDIR": str(self.temp_dir(index)), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self._token,
                "RAY_USAGE_STATS_ENABLED": "0"}

    def _start_node(self, index: int) -> NetnsProcess:
        member = self.network.members[index]
        self.temp_dir(index).mkdir()
        argv = [sys.executable, "-m", "ray.scripts.scripts", "start", f"--node-ip-address={member.address}",
                f"--num-cpus={self.num_cpus}", "--num-gpus=0", f"--object-store-memory={self.object_store_bytes}",
                f"--resources={json.dumps(self.marks(index))}", f"--temp-dir={self.temp_dir(index)}",
                "--disable-usage-stats"]
        if index == 0:
            argv += ["--head", f"--port={self.port}", "--include-dashboard=false"]
        else:
            argv += [f"--address={self.address}"]
        return self.network.spawn(index, argv, name=f"ray-start-{index}", env=self.environment(index))

    def _open(self) -> None:
        # `ray start` returns once its node is registered with the GCS: when all have returned 0,
        # the cluster has every node
        head = self._start_node(0)
        self._check_started(head)
        workers = [self._start_node(i) for i in range(1, self.network.size)]
        for process in workers:
            self._check_started(process)
        self._started = True

    def _check_started(self, process: NetnsProcess) -> None:
        code = process.wait(self.start_timeout_s)
        if code != 0:
            raise NetnsError(f"`ray start` exited with {code}; its log ends:\n{process.tail()}")

    def run_driver(self, argv: Sequence[str], *, name: str, timeout: float = 120.0, index: int = 0,
                   env: Mapping[str, str] | None = None) -> Result:
        """Run a driver (``argv``, e.g. ``[sys.executable, script, ...]``) in
        member ``index``'s namespace with ``RAY_ADDRESS`` set to the head, so
        ``ray.init()`` (or ``ray.init(address=os.environ["RAY_ADDRESS"])``)
        joins this cluster."""
        if not self._started or self._closed:
            raise NetnsError("the Ray cluster is not running")
        environment = {**self.environment(index), "RAY_ADDRESS": self.address, **(env or {})}
        return self.network.run(index, argv, name=name, timeout=timeout, env=environment)

    def close(self) -> None:
        """Stop every Ray process of the cluster (all processes in the
        namespaces but the subreapers) and remove the nodes' temp dirs; the
        namespaces stay. Idempotent."""
        if self._closed:
            return
        with _sigint_deferred():
            names = [m.namespace for m in self.network.members]
            try:
                # SIGKILL at once: on SIGTERM the raylets drain and the GCS waits for them (seconds), and
                # nothing of a node needs a graceful end when its namespace and temp dir go next
                kill_namespace_processes(names, spare=self.network.reaper_pids(), grace_s=0.0)
            finally:
                self._closed = True
                for index in range(len(self.network.members)):
                    shutil.rmtree(self.temp_dir(index), ignore_errors=True)


# -- the subreaper: this file run as a script ------------------------------------------------------------------


def _reap(status_path: str, argv: list[str]) -> int:
    """Run ``argv`` as a child; collect it, write its exit status to
    ``status_path``, and collect every process it leaves behind (orphans are
    re-parented to this process, a child subreaper); return when none is left.

    PID 1 of a container often reaps orphans late or never; Ray's daemons are
    orphans as soon as ``ray start`` returns, and a killed one would stay a
    zombie."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"netns reaper: prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}", file=sys.stderr)
    try:
        child = os.posix_spawnp(argv[0], argv, os.environ)
    except OSError as e:
        print(f"netns reaper: cannot start {argv[0]}: {e}", file=sys.stderr, flush=True)
        _write_status(status_path, 127)
        return 127
    code = 0
    while True:
        try:
            pid, wait_status = os.wait()
        except ChildProcessError:
            return code
        if pid == child:
            code = os.waitstatus_to_exitcode(wait_status)
            code = code if code >= 0 else 128 - code
            _write_status(status_path, code)


def _write_status(path: str, code: int) -> None:
    partial = f"{path}.partial"
    with open(partial, "w") as f:
        f.write(str(code))
    os.replace(partial, path)


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit("usage: netns.py STATUS_FILE -- COMMAND [ARG ...]")
    sys.exit(_reap(sys.argv[1], sys.argv[3:]))
