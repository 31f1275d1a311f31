"""The direct slurmd probe, simulated: it sees what a TCP connect to a real slurmd sees.

A dead slurmd refuses the connection. A hung (frozen) slurmd still completes the handshake — the
kernel accepts into the listening socket's backlog — so the probe calls it alive, exactly like the
real probe; Slurm's own NOT_RESPONDING catches that case."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from supervisor.domain.cluster import NodeInfo
from supervisor.sim.slurm.cluster import SimCluster


class SimProbe:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def probe(self, nodes: Iterable[NodeInfo]) -> Mapping[str, str | None]:
        names = [info.name for info in nodes]
        out: dict[str, str | None] = dict.fromkeys(names)
        for name in self.cluster.dead_slurmds(names):
            out[name] = f"connect to {name}:6818: ECONNREFUSED (simulated)"
        return out
