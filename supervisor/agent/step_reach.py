"""Which of the step's nodes do not answer: the launcher's own look at their slurmd (a TCP
connect, as the daemon's probe), so the daemon hears of a dead node within a launcher poll
rather than at its next tick — srun itself notices only once Slurm calls the node DOWN
(docs/in-allocation.md). A hint only: the daemon's own probe decides.

The nodes' addresses and slurmd ports are read from Slurm once per set of step nodes. Whatever
goes wrong on the launcher's side (Slurm unreadable, a node not probed) is no evidence: the node
is left out, never called unreachable."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import structlog

from supervisor.adapters.slurm.tcp_probe import TcpProbe
from supervisor.domain.cluster import ClusterSnapshot, NodeInfo
from supervisor.ports import PortError

log = structlog.get_logger(__name__)


class NodeReader(Protocol):
    """Slurm's view of the job and the named nodes (``SlurmCli``)."""

    def snapshot_of(self, jobs: Collection[int] | None, include_nodes: bool | Collection[str]) -> ClusterSnapshot: ...


class SlurmdReach:
    def __init__(self, slurm: NodeReader, job_id: int, probe: TcpProbe | None = None) -> None:
        self.slurm, self.job_id = slurm, job_id
        self.probe = probe or TcpProbe(timeout=0.5, window=64)
        self._infos: tuple[tuple[str, ...], list[NodeInfo]] = ((), [])

    def __call__(self, nodes: tuple[str, ...]) -> tuple[str, ...]:
        try:
            answers = self.probe.probe(self._nodes(nodes))
        except OSError as exc:  # the launcher's own trouble (descriptors): no node's fault
            log.warning("launcher_probe_not_run", error=f"{type(exc).__name__}: {exc}")
            return ()
        return tuple(sorted(n for n, failure in answers.items() if failure is not None and n in nodes))

    def _nodes(self, nodes: tuple[str, ...]) -> list[NodeInfo]:
        if self._infos[0] != nodes:
            try:
                found = self.slurm.snapshot_of([self.job_id], set(nodes)).nodes
            except PortError as exc:
                log.warning("launcher_probe_nodes_unread", error=str(exc))
                return []  # asked again at the next poll
            self._infos = (nodes, [found[n] for n in nodes if n in found])
        return self._infos[1]
