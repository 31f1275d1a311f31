"""Direct node probes, confirmed over time: a node is called dead only after it has failed every
probe for at least ``confirm_s`` seconds (two failures at the least), so a slurmd restart or one
lost packet does not cost a run its node."""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from supervisor.domain.cluster import ClusterSnapshot
from supervisor.ports import NodeProbe

log = structlog.get_logger("supervisor.probes")


class ProbeTracker:
    def __init__(self, probe: NodeProbe | None, confirm_s: float) -> None:
        self.probe = probe
        self.confirm_s = confirm_s
        self._failing: dict[str, tuple[float, int]] = {}  # node -> (first failure, failures seen)

    @property
    def suspects(self) -> frozenset[str]:
        """Nodes with failed probes not yet confirmed dead."""
        return frozenset(self._failing)

    def update(self, nodes: Iterable[str], snap: ClusterSnapshot, now: float) -> dict[str, str]:
        """Probe ``nodes``; return the confirmed dead ones with their evidence."""
        if self.probe is None:
            return {}
        infos = [snap.nodes[n] for n in sorted(set(nodes)) if n in snap.nodes]
        results = self.probe.probe(infos) if infos else {}
        dead: dict[str, str] = {}
        for name, failure in results.items():
            if failure is None:
                if self._failing.pop(name, None) is not None:
                    log.info("probe_recovered", node=name)
                continue
            first, count = self._failing.get(name, (now, 0))
            self._failing[name] = (first, count + 1)
            if count + 1 >= 2 and now - first >= self.confirm_s:
                dead[name] = f"slurmd probe failed {count + 1} times over {now - first:.1f} s: {failure}"
            elif count == 0:
                log.info("probe_failed", node=name, failure=failure)
        for name in set(self._failing) - set(results):
            del self._failing[name]
        return dead
