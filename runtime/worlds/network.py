"""The network and the collective backend of a world of worker processes: the
interface gloo binds to (loopback on this host, the interface that carries
the machine's address on a cluster), and gloo or NCCL."""

from __future__ import annotations

from typing import Any

from thrifty.core.errors import ProblemError
from thrifty.core.optional import require

__all__ = ["loopback_interface", "interface_of", "resolve_backend"]


def _import_torch() -> Any:
    require("torch.distributed", "torch", package="torch")
    return require("torch", "torch")


def loopback_interface() -> str | None:
    """The name of the loopback network interface (for GLOO_SOCKET_IFNAME), or None."""
    import socket

    for _, name in socket.if_nameindex():
        if name.startswith("lo"):
            return name
    return None


def interface_of(address: str) -> str | None:
    """The name of the network interface that carries the IPv4 `address`
    (for GLOO_SOCKET_IFNAME on a machine of a cluster), or None (not Linux,
    or no interface has it)."""
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                answer = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on this interface
                continue
            if socket.inet_ntoa(answer[20:24]) == address:
                return name
    return None


def resolve_backend(requested: str = "auto") -> str:
    """``"nccl"`` when asked or when CUDA is available under ``"auto"``; else ``"gloo"``."""
    torch = _import_torch()
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise ProblemError("backend 'nccl' needs CUDA GPUs, but torch sees none")
    return requested
