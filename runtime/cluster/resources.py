"""The Ray custom resources that mark a node as a thrifty machine.

A node started for a plan carries ``thrifty-machine:<id>`` (its machine: an
EC2 instance id, say), ``thrifty-type:<instance type>`` and
``thrifty-market:<market>``, one unit each. The driver finds machines of a
type by the second, pins a machine's agent by the first (or by node id, for
nodes of a running cluster that carry no machine resource), and reads the
market from the third (a node without one is on-demand).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["MACHINE", "TYPE", "MARKET", "machine_resource", "type_resource", "market_resource", "node_resources",
           "node_marks"]

MACHINE, TYPE, MARKET = "thrifty-machine:", "thrifty-type:", "thrifty-market:"


def machine_resource(machine_id: str) -> str:
    return MACHINE + machine_id


def type_resource(instance_type: str) -> str:
    return TYPE + instance_type


def market_resource(market: str) -> str:
    return MARKET + market


def node_resources(machine_id: str, instance_type: str, market: str) -> dict[str, float]:
    """The marks of one machine's node, one unit each (what ``thrifty node join`` gives it)."""
    return {machine_resource(machine_id): 1.0, type_resource(instance_type): 1.0, market_resource(market): 1.0}


def node_marks(resources: Mapping[str, float]) -> tuple[str | None, str | None, str]:
    """``(machine id, instance type, market)`` of a node from its resources
    (None where it carries no mark; ``on_demand`` when no market)."""
    def mark(prefix: str) -> str | None:
        found = sorted(k[len(prefix):] for k in resources if k.startswith(prefix))
        return found[0] if found else None

    return mark(MACHINE), mark(TYPE), mark(MARKET) or "on_demand"
