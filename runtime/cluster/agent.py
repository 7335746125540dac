"""The agent of one machine of a Ray cluster: `MachineAgent`, a Ray actor.

The driver starts one agent per machine of a plan, pinned to that machine's
node (by its ``thrifty-machine:<id>`` resource, or by node id), and keeps it
for as long as it holds the machine, across re-plans; a node of a running
cluster that the driver gives back keeps its agent until the run ends, and
a later lease of the node in the same run takes that agent, warm (`lease`).

What the agent does for the worlds of its machine is the worlds package's
node side (`thrifty.runtime.worlds.ray.NodeRanks`): it starts the node's
fork server at once and forks the world's ranks of this machine from it,
hosts the world's store when the machine has rank 0, reports its ranks' exit
codes and kills them on request. What it adds is about the machine itself:
its identity (`lease`, `info`) and its spot notices: it polls the machine's
metadata service (IMDSv2, in a thread:
`thrifty.runtime.providers.imds.ImdsPoller`) where the node says where it is
(``THRIFTY_IMDS_URL`` in the node's environment: set by ``thrifty node
join`` on EC2, and by tests), and hands them to the driver.

Deviation from "one actor per worker": the issue asks for one actor per
device. An agent per machine that forks the machine's ranks keeps what makes
the local launcher fast (a re-plan starts a new world in milliseconds from a
warm fork server, where fresh actors would import torch again on every
switch), while placement, and so the resource accounting, stays per machine:
the plan owns whole machines.

Every rank dies with the agent: the fork server leaves when the agent's
process ends (its stdin closes), and kills its ranks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from thrifty.core.optional import require
from thrifty.runtime.worlds.ray import NodeRanks

__all__ = ["MachineAgent", "IMDS_ENV"]

IMDS_ENV = "THRIFTY_IMDS_URL"


class MachineAgent(NodeRanks):
    """One machine's agent (see the module docstring). Plain class: the
    provider makes it a Ray actor (``ray.remote(MachineAgent)``)."""

    def __init__(self, machine_id: str, instance_type: str, market: str, preload: Sequence[str] = (),
                 imds_interval_s: float = 5.0):
        super().__init__(preload)
        self.machine_id, self.instance_type, self.market = machine_id, instance_type, market
        self.node_id = require("ray", "ray").get_runtime_context().get_node_id()
        self._poller: Any = None
        url = os.environ.get(IMDS_ENV)
        if url:
            from thrifty.runtime.providers.imds import ImdsPoller

            self._poller = ImdsPoller(instance_type, market, machine_id, base_url=url,
                                      interval_s=imds_interval_s).start()

    def lease(self, machine_id: str) -> None:
        """This node is now machine `machine_id` (the driver took it again after giving it back): the
        fork server, warm, stays; spot notices name the new machine."""
        self.machine_id = machine_id

    def info(self) -> dict[str, Any]:
        return {"machine_id": self.machine_id, "node_ip": self.node_ip, "node_id": self.node_id,
                "pid": os.getpid(), "imds": self._poller is not None}

    # -- spot notices ----------------------------------------------------------------------
    def notices(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Spot notices seen since the last call, as `Preemption` dicts; with
        `wait_s`, a long poll: returns as soon as one is seen, or empty after
        that long (the driver keeps one such call open per agent, so a notice
        reaches it at once instead of at its next poll)."""
        if self._poller is None:
            if wait_s > 0:
                time.sleep(wait_s)
            return []
        from thrifty.core.validation import json_object

        return [{**json_object(e), "machine_id": self.machine_id} for e in self._poller.events(wait_s)]
