"""The network and the collective backend of a world of worker processes on
this host: the loopback interface gloo binds to, and gloo or NCCL."""

from __future__ import annotations

from typing import Any

from thrifty.datasets.errors import ProblemError
from thrifty.datasets.optional import require

__all__ = ["loopback_interface", "resolve_backend"]


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


def resolve_backend(requested: str = "auto") -> str:
    """``"nccl"`` when asked or when CUDA is available under ``"auto"``; else ``"gloo"``."""
    torch = _import_torch()
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested == "nccl" and not torch.cuda.is_available():
        raise ProblemError("backend 'nccl' needs CUDA GPUs, but torch sees none")
    return requested
