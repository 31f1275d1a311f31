"""The direct slurmd probe, simulated: it sees what a TCP connect to a real slurmd sees.

A dead slurmd refuses the connection. A hung (frozen) slurmd still completes the handshake — the
kernel accepts into the listening socket's backlog — so the probe calls it alive, exactly like the
real probe; Slurm's own NOT_RESPONDING catches that case."""

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
            if not alive and not frozen:  # a frozen slurmd's port still accepts, as on a real node
                out[info.name] = f"connect to {info.name}:6818: ECONNREFUSED (simulated)"
            else:
                out[info.name] = None
        return out
