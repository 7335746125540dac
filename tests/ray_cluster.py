"""A three-node Ray cluster on this host for the cluster tests and
benchmarks: every node bound to 127.0.0.1 (`ray.cluster_utils.Cluster`), each
with its own local IMDSv2 server (``THRIFTY_IMDS_URL`` in the node's
environment), so spot notices can be posted per node and removing a node is
the preemption."""

from __future__ import annotations

from aws_fakes import ImdsServer

from thrifty.runtime.cluster.connect import keep_loopback

NODE = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "object_store_memory": 80 * 2**20}
SPOT_A = {"thrifty-type:local-a": 1, "thrifty-market:spot": 1}


class ThreeNodes:
    """A head and two nodes: the head and `spare` are local-a spot machines,
    `other` a local-b on-demand one; each node has its own metadata service."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        keep_loopback()
        self.imds: dict[str, ImdsServer] = {}
        self.cluster = Cluster(initialize_head=True, head_node_args={
            **NODE, "include_dashboard": False, "resources": SPOT_A, "env_vars": self._imds("head")})
        self.spare = self.other = None
        self.refill()

    def _imds(self, name: str) -> dict[str, str]:
        if name in self.imds:
            self.imds[name].close()
        server = self.imds[name] = ImdsServer(f"i-{name}").start()
        return {"THRIFTY_IMDS_URL": server.url}

    def refill(self) -> None:
        """Bring the cluster back to three live nodes."""
        if self.spare is None:
            self.spare = self.cluster.add_node(**NODE, resources=SPOT_A, env_vars=self._imds("spare"))
        if self.other is None:
            self.other = self.cluster.add_node(**NODE, resources={"thrifty-type:local-b": 1},
                                               env_vars=self._imds("other"))
        self.cluster.wait_for_nodes()

    def remove_spare(self) -> None:
        node, self.spare = self.spare, None
        self.cluster.remove_node(node)

    def close(self) -> None:
        self.cluster.shutdown()
        for server in self.imds.values():
            server.close()
