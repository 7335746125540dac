"""The rank side of tests/test_cluster_netns.py: what a rank of a thrifty
world on the namespaced Ray cluster runs, and how it reports what it sees.

`allreduce` is a world's entry (``netns_ranks:allreduce``): the machine agent
of each node forks it from that node's fork server, with this folder on its
``sys.path`` (the driver's, which the Ray launcher hands to the agents), and
the world's torchrun environment. It joins the world's gloo process group
through the world's store, allreduces float64 values, and reports its
interface and addresses and the TCP connections it holds: a rank is a fresh
fork, so every connection it has belongs to the world (to the store on rank
0's machine, and gloo's full mesh).

psutil comes from Ray's own copy (``ray/thirdparty_files``, on the path of
every process that imported Ray, the agents' and so the ranks' too).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import Any


def rank_values(rank: int) -> list[float]:
    """What rank ``rank`` contributes: sums of these are exact in float64 and
    not in float32 (1e15 + rank), so a result checks the dtype too."""
    return [(rank + 1) * 0.25, 2.0 ** -(rank + 10), 1e15 + rank, -3.0 * (rank + 1)]


def plain_ip(address: str) -> str:
    """``address`` with an IPv4-mapped IPv6 address written as IPv4."""
    parsed = ipaddress.ip_address(address)
    mapped = getattr(parsed, "ipv4_mapped", None)
    return str(mapped or parsed)


def ipv4_by_interface() -> dict[str, list[str]]:
    """The IPv4 addresses this process's network namespace has, by interface."""
    import psutil

    return {name: sorted(a.address for a in entries if a.family == socket.AF_INET)
            for name, entries in psutil.net_if_addrs().items()}


def tcp_connections() -> list[tuple[str, str]]:
    """This process's established TCP connections as (local ip, remote ip)."""
    import psutil

    return sorted((plain_ip(c.laddr.ip), plain_ip(c.raddr.ip))
                  for c in psutil.Process().net_connections("tcp") if c.raddr and c.status == psutil.CONN_ESTABLISHED)


def allreduce(argv: list[str]) -> None:
    """A world's entry: allreduce `rank_values(rank)` in float64 over gloo and
    finish with what this rank saw."""
    from thrifty.runtime.worlds import join_world, serve_rank

    def body(channel: Any) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        join_world(channel, "gloo")
        tensor = torch.tensor(rank_values(channel.rank), dtype=torch.float64)
        dist.all_reduce(tensor)
        interface = os.environ.get("GLOO_SOCKET_IFNAME", "")
        # while the group is up: its connections are open
        report = {"rank": channel.rank, "interface": interface, "ipv4": ipv4_by_interface(),
                  "master": [os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])],
                  "dtype": str(tensor.dtype), "sum": tensor.tolist(), "connections": tcp_connections()}
        dist.barrier()  # no rank closes its sockets before every rank has counted them
        dist.destroy_process_group()
        channel.finish(report)

    serve_rank(body)
