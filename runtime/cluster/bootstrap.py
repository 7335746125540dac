"""How an EC2 machine becomes a node of the run's Ray cluster: it joins
from its user data (docs/architecture.md, "Machines and launchers").

`join_script` renders the user data: a bash script that cloud-init runs once,
as root, on first boot. It runs the cluster config's setup commands (first,
so that they can prepare what the installation needs: a driver, an activated
environment, a wheel fetched from a bucket), installs thrifty as the config's
``install`` says, and ends with ``thrifty node join --address HEAD``.

``thrifty node join`` (`join_cluster`) reads the machine's identity from its
metadata service (instance id, private IPv4, instance type and market;
`thrifty.runtime.providers.imds.instance_identity`), unless given, and starts
a Ray worker node at that IP marked with one unit of each of its custom
resources (`thrifty.runtime.cluster.resources.node_resources`), so the driver
can pin workers to the machine and tell which node is which. The script is
the same for every launch of a run: what differs between machines comes from
the machine itself.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from thrifty.core.errors import ProblemError, ProviderError
from thrifty.core.optional import require
from thrifty.runtime.cluster.connect import is_loopback
from thrifty.runtime.cluster.resources import node_resources
from thrifty.runtime.providers.addresses import check_ip, parse_address

if TYPE_CHECKING:
    from thrifty.runtime.providers.config import ClusterConfig

__all__ = ["EXTRAS", "join_script", "install_command", "installed_version", "check_name", "ray_cli_code",
           "ray_start_command", "RayDaemons", "start_ray_daemons", "join_cluster"]

# What a machine needs of thrifty: the Ray engine and the training worker.
EXTRAS = "ray,torch"
# Instance ids, instance types and markets become parts of Ray resource names: no ':', no spaces.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# `ray start` as Ray's own console script runs it (argv[0] is the program name Ray prints).
_RAY_CLI = "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"
_LOOPBACK_PATCH = "import ray._private.services as s; s.resolve_ip_for_localhost = lambda host: host; "


# -- the user data --------------------------------------------------------------------------------------------
def join_script(config: ClusterConfig, head_address: str, *, version: str | None = None,
                env: Mapping[str, str] | None = None) -> str:
    """The user data of a machine that joins the Ray cluster whose head is at
    `head_address` (``host:port``): ``set -euo pipefail``, the config's setup
    commands (as written: they are shell), thrifty's installation
    (`install_command`; `version` is the driver's thrifty version, by default
    this installation's), the exports of `env` (such as the head's
    authentication token, `thrifty.runtime.cluster.head.RayHead.auth_env`),
    then ``thrifty node join``."""
    host, port = parse_address(head_address)
    lines = ["#!/bin/bash",
             f"# thrifty: join the Ray cluster at {host}:{port} as one worker node (thrifty node join)",
             "set -euo pipefail"]
    lines += config.setup_commands
    install = install_command(config.install, version)
    if install is not None:
        lines.append(install)
    lines += [f"export {name}={shlex.quote(value)}" for name, value in (env or {}).items()]
    lines.append(shlex.join(["thrifty", "node", "join", "--address", f"{host}:{port}"]))
    return "\n".join(lines) + "\n"


def install_command(install: str, version: str | None = None) -> str | None:
    """The shell command that installs thrifty with its machine extras:
    ``version``: that version from the package index (`version`, by default
    this installation's); a wheel path or URL: that wheel; ``none``: None."""
    if install == "none":
        return None
    if install == "version":
        requirement = f"thrifty[{EXTRAS}]=={version or installed_version()}"
    elif install.startswith("/"):
        requirement = f"thrifty[{EXTRAS}] @ {Path(install).as_uri()}"
    else:
        requirement = f"thrifty[{EXTRAS}] @ {install}"
    return shlex.join(["python3", "-m", "pip", "install", requirement])


def installed_version() -> str:
    """This installation's thrifty version (what the machines install by default)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("thrifty")
    except PackageNotFoundError:
        raise ProblemError("cannot tell which thrifty version the machines should install (thrifty is not "
                           "installed, only imported from a source tree); set install to a wheel in the cluster "
                           "config") from None


# -- input ------------------------------------------------------------------------------------------------------
def check_name(what: str, value: str) -> str:
    """`value` if it can be part of a Ray resource name (letters, digits,
    ``.``, ``_``, ``-``; 1 to 128 characters), else `ProblemError` naming `what`."""
    if not _NAME.match(value):
        raise ProblemError(f"{what} is '{value}', but must be 1 to 128 letters, digits, '.', '_' or '-', "
                           "starting with a letter or digit")
    return value


# -- ray start ----------------------------------------------------------------------------------------------------
def ray_start_command(head_address: str, *, node_ip: str, resources: dict[str, float],
                      num_cpus: int | None = None, num_gpus: int | None = None) -> list[str]:
    """The argv of ``ray start`` for a worker node, run by this Python.

    CPUs and GPUs are left to Ray's detection unless given. A loopback head
    address gets one patch in the ``ray start`` process: Ray rewrites a
    bootstrap address of 127.0.0.1 or localhost to this host's outbound IP
    (``ray._private.services.canonicalize_bootstrap_address`` calls
    ``resolve_ip_for_localhost``), on the theory that a head on "localhost"
    listens on every interface. A head bound to loopback only (tests play
    machines on 127.0.0.1) does not listen there, and ``ray start`` would
    retry for minutes; so for such an address that function is replaced by
    the identity before Ray's command line runs (what
    `thrifty.runtime.cluster.connect.keep_loopback` does for a driver). Every
    other address reaches Ray unchanged.
    """
    host, port = parse_address(head_address)
    argv = [sys.executable, "-c", ray_cli_code(host), "start", f"--address={host}:{port}",
            f"--node-ip-address={node_ip}",
            "--resources=" + json.dumps(resources, sort_keys=True)]
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    if num_gpus is not None:
        argv.append(f"--num-gpus={num_gpus}")
    return argv


def ray_cli_code(host: str) -> str:
    """``python -c`` code that runs Ray's command line; for a loopback `host`
    with the patch that keeps Ray from rewriting it (see `ray_start_command`)."""
    return (_LOOPBACK_PATCH if is_loopback(host) else "") + _RAY_CLI


def join_cluster(head_address: str, *, node_ip: str, machine_id: str, instance_type: str, market: str,
                 num_cpus: int | None = None, num_gpus: int | None = None, imds_url: str | None = None,
                 log_path: Path | None = None, timeout_s: float = 600.0) -> str:
    """Start this machine's Ray worker node and return what ``ray start`` said.

    The node carries `node_resources(machine_id, instance_type, market)`;
    ``THRIFTY_IMDS_URL`` (`imds_url`, by default the one this process sees)
    is in the environment of every process on the node, so a worker there
    polls its own machine's spot notices. ``ray start`` leaves its daemons
    running and returns; its output goes to `log_path` (default: a file in
    the temporary directory named after the machine), never to a pipe, which
    the daemons would hold open. `ProviderError` when it fails or runs past
    `timeout_s` (then its processes are killed); `ProblemError` on bad input.
    """
    from thrifty.runtime.providers.imds import IMDS_URL_ENV
    from thrifty.runtime.providers.imds import imds_url as default_imds_url

    require("ray", "ray")
    check_ip(node_ip)
    if market not in ("spot", "on_demand"):
        raise ProblemError(f"market is '{market}', but must be 'spot' or 'on_demand'")
    resources = node_resources(check_name("machine id", machine_id), check_name("instance type", instance_type),
                               market)
    argv = ray_start_command(head_address, node_ip=node_ip, resources=resources, num_cpus=num_cpus,
                             num_gpus=num_gpus)
    env = {**os.environ, IMDS_URL_ENV: imds_url or default_imds_url()}
    log_path = log_path or Path(tempfile.gettempdir()) / f"thrifty-node-{machine_id}.log"
    with open(log_path, "w", encoding="utf-8") as log:
        # Its own process group: on a timeout, ray start and whatever it started go together.
        process = start_ray_daemons(argv, log, env)
        try:
            code = process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise ProviderError(f"ray start did not join the cluster at {head_address} within {timeout_s:g} s "
                                f"(its output: {log_path}):\n{_tail(log_path)}") from None
        except BaseException:
            _kill_group(process)
            raise
    said = log_path.read_text(encoding="utf-8", errors="replace")
    if code != 0:
        raise ProviderError(f"ray start exited with {code} (its output: {log_path}):\n{_tail(log_path)}")
    return said


RayDaemons = subprocess.Popen  # the process of a `ray start` (and its group: the daemons it leaves)


def start_ray_daemons(argv: list[str], log: IO[Any], env: Mapping[str, str]) -> RayDaemons[bytes]:
    """Run ``ray start`` (`argv`: a worker node's, or the head's) in a process
    group of its own, its output to `log`, never to a pipe (the daemons it
    leaves would hold a pipe open).

    The one place outside the worker-world package (`thrifty.runtime.worlds`)
    that starts a process: Ray's daemons are not worker processes, and Ray
    starts and watches them itself (tests/test_layering.py names it)."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                            process_group=0)


def _kill_group(process: RayDaemons[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
