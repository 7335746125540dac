"""Checks of the network addresses a user gives, in a cluster config file
(`thrifty.runtime.providers.config`: ``head_address``, ``head_ip``) or on
``thrifty node join``'s command line (`thrifty.runtime.cluster.bootstrap`):
``host:port`` and IP addresses, each refused with a `ProblemError` that says
what is required. Both the config's schema and the cluster's bootstrap import
this module, so neither imports the other to check an address."""

from __future__ import annotations

import ipaddress
import re

from thrifty.core.errors import ProblemError

__all__ = ["parse_address", "check_ip"]

_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")


def parse_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of a ``host:port`` address (a hostname or an IPv4
    address, a port in 1..65535); `ProblemError` otherwise."""
    host, colon, port = address.rpartition(":")
    if not colon or not _HOST.match(host) or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ProblemError(f"address '{address}' must be HOST:PORT, a hostname or IPv4 address and a port in "
                           "1..65535 (e.g. 10.0.0.5:6379)")
    return host, int(port)


def check_ip(value: str) -> str:
    """`value` if it is an IPv4 or IPv6 address, else `ProblemError`."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ProblemError(f"node IP '{value}' is not an IP address") from None
    return value
