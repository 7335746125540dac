"""Joining a Ray cluster from the driver: `connect`.

Where the cluster's address is a loopback address (a cluster whose nodes all
run on this host at 127.0.0.1: tests, a one-host cluster), Ray would rewrite
it to this host's outbound address (``canonicalize_bootstrap_address`` calls
``resolve_ip_for_localhost``, so that the nodes of a multi-host cluster agree
on one address), where a head bound to 127.0.0.1 does not listen, and the
driver would hang. For a loopback address only, `keep_loopback` makes this
process keep the address as given (Ray offers no setting for it on Linux;
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` also stops the rewrite but forbids
joining worker nodes), and the driver takes 127.0.0.1 as its own node address.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from thrifty.datasets.errors import ProblemError
from thrifty.datasets.optional import require

__all__ = ["connect", "keep_loopback", "is_loopback", "import_ray"]


def import_ray() -> Any:
    return require("ray", "ray")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(address: str) -> str:
    rest = address.split("://", 1)[-1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


def keep_loopback() -> None:
    """Have Ray keep a loopback cluster address in this process (see the module docstring)."""
    import_ray()
    from ray._private import services

    services.resolve_ip_for_localhost = lambda host: host


def connect(address: str = "auto", *, log_to_driver: bool = False) -> None:
    """Join the Ray cluster at `address` (``auto``: the one running on this
    host; ``HOST:PORT``; ``ray://HOST:PORT``, Ray Client) unless this process
    already has. Raises `ProblemError` naming the address when none answers."""
    ray = import_ray()
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"address": address, "log_to_driver": log_to_driver}
    if address != "auto" and not address.startswith("ray://") and is_loopback(host_of(address)):
        keep_loopback()
        kwargs["_node_ip_address"] = "127.0.0.1"
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ProblemError(f"cannot join the Ray cluster at {address}: {e}", path="cluster") from e
