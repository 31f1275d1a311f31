"""The direct slurmd probe, simulated: it sees the simulated node's real state, as a TCP connect
to a real slurmd would (refused when slurmd is dead, no answer when the node is frozen)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from supervisor.domain.cluster import NodeInfo
from supervisor.sim.cluster import SimCluster


class SimProbe:
    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def probe(self, nodes: Iterable[NodeInfo]) -> Mapping[str, str | None]:
        out: dict[str, str | None] = {}
        for info in nodes:
            alive, frozen = self.cluster.slurmd_status(info.name)
            if frozen:
                out[info.name] = f"connect to {info.name}:6818: no answer within 1.0 s (simulated)"
            elif not alive:
                out[info.name] = f"connect to {info.name}:6818: ECONNREFUSED (simulated)"
            else:
                out[info.name] = None
        return out
