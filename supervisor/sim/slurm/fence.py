"""A site fence for the simulated cluster: "power off" the node through its BMC — every process on
it dies, whatever state its slurmd is in."""

from __future__ import annotations

from supervisor.sim.slurm.cluster import SimCluster


class SimFencer:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster
        self.fenced: list[str] = []

    def fence(self, node: str) -> None:
        self.fenced.append(node)
        self.cluster.crash_node(node)
