"""Joining a Ray cluster from the driver (`connect`), and reading its nodes
without joining it (`read_nodes`).

The address a user gives is the address used. Ray would rewrite a loopback
address (127.0.0.1, localhost) to this host's outbound address
(``canonicalize_bootstrap_address`` calls ``resolve_ip_for_localhost``, so
that the nodes of a multi-host cluster agree on one address), where a head
bound to 127.0.0.1 does not listen, and the driver would hang; for a
loopback address only, `keep_loopback` makes this process keep the address
as given (Ray offers no setting for it on Linux;
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` also stops the rewrite but forbids
joining worker nodes).

The driver attaches to a node of the cluster on its own host, whatever
address Ray registered that node under: ``ray start --head
--node-ip-address=127.0.0.1`` registers its node under the host's outbound
address (Ray resolves the loopback node address as it does the cluster's),
so the driver does not name a node address: Ray finds the node by the
raylets running on this host (``get_node_to_connect_for_driver``). (Naming
127.0.0.1 there made Ray look for a node registered under 127.0.0.1, and
give up after 60 s: "No node info found matching attributes: '127.0.0.1'".)

`connect` first reads the cluster's node table over the GCS protocol
(`read_nodes`: no driver, no job, nothing printed), so that an address where
no cluster answers, or a cluster with no node on this host, is a one-line
error at once instead of Ray's minute of retries.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Any

from thrifty.core.errors import ProblemError
from thrifty.core.optional import require

__all__ = ["connect", "keep_loopback", "is_loopback", "import_ray", "read_nodes", "gcs_address"]

REACH_TIMEOUT_S = 5.0


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


def gcs_address(address: str) -> str:
    """The ``HOST:PORT`` of the cluster's head (its GCS) that `address` names:
    itself, or for ``auto`` the cluster running on this host (``RAY_ADDRESS``,
    else the last ``ray start`` here, else the one GCS running here), as Ray
    finds it. `ProblemError` (path ``cluster``) when ``auto`` finds none, or
    for a Ray Client address (``ray://``), whose nodes only a client session
    can read."""
    if address.startswith("ray://"):
        raise ProblemError(f"'{address}' is a Ray Client address: its nodes are read by joining it",
                           path="cluster")
    if address != "auto":
        return address
    import_ray()
    from ray._private import services

    ray_logger = logging.getLogger("ray")
    level = ray_logger.level
    ray_logger.setLevel(logging.ERROR)  # not Ray's warning that it chose the newest of several clusters here
    try:
        return str(services.canonicalize_bootstrap_address_or_die("auto"))
    except ConnectionError as e:
        raise ProblemError(f"auto: no Ray cluster runs on this host ({e})", path="cluster") from None
    finally:
        ray_logger.setLevel(level)


def read_nodes(address: str) -> list[dict[str, Any]]:
    """The node table of the cluster at `address` (``HOST:PORT`` or ``auto``),
    as ``ray.nodes()`` gives it (``NodeID``, ``Alive``,
    ``NodeManagerAddress``, ``Resources``), read from the cluster's GCS
    without joining the cluster. `ProblemError` (path ``cluster``) when
    nothing answers there or the answer is not a cluster's."""
    gcs = gcs_address(address)
    host, _, port = gcs.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S):
            pass
    except (OSError, ValueError) as e:
        found = f"auto found a Ray cluster at {gcs} (the newest one started on this host), but " \
            if address == "auto" else ""
        raise ProblemError(f"{found}no Ray cluster answers at {gcs} ({getattr(e, 'strerror', None) or e}); "
                           f"start its head with `ray start --head --port={port}`, or give the address it printed",
                           path="cluster") from None
    import_ray()
    from ray._private import services, state

    if is_loopback(host):
        keep_loopback()
    table = state.GlobalState()
    try:
        table._initialize_global_state(services._get_gcs_client_options(gcs))
        return list(table.node_table())
    except Exception as e:  # noqa: BLE001 - Ray's errors here have no common base: any is "not a cluster"
        raise ProblemError(f"cannot read the nodes of the Ray cluster at {gcs}: {type(e).__name__}: {e}",
                           path="cluster") from None
    finally:
        table.disconnect()


def connect(address: str = "auto", *, log_to_driver: bool = False) -> None:
    """Join the Ray cluster at `address` (``auto``: the one running on this
    host; ``HOST:PORT``; ``ray://HOST:PORT``, Ray Client) unless this process
    already has, through the cluster's node on this host. Raises
    `ProblemError` naming the address when no cluster answers there, when
    none of its nodes runs on this host, or when Ray cannot join it."""
    ray = import_ray()
    if ray.is_initialized():
        return
    if not address.startswith("ray://"):
        _check_local_node(address)
        if address != "auto" and is_loopback(host_of(address)):
            keep_loopback()
    try:
        ray.init(address=address, log_to_driver=log_to_driver)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ProblemError(f"cannot join the Ray cluster at {address}: {e}", path="cluster") from e


def _check_local_node(address: str) -> None:
    """A driver joins a cluster through one of its nodes on the driver's own
    host (Ray finds the raylets running here): say so now when there is none."""
    from ray._private import services

    alive = {n["NodeID"] for n in read_nodes(address) if n.get("Alive")}
    if alive and not alive & set(services.find_node_ids()):
        raise ProblemError(
            f"none of the {len(alive)} nodes of the Ray cluster at {address} runs on this host, and a driver "
            f"joins a cluster through a node on its own host: run thrifty on a node of the cluster (its head, "
            f"say), or make this host a node first (`ray start --address={gcs_address(address)}`)",
            path="cluster")
