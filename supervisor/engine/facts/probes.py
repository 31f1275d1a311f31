"""Direct node probes, confirmed over time: a node is called dead only after it has failed every
probe for at least ``confirm_s`` seconds (two failures at the least), so a slurmd restart or one
lost packet does not cost a run its node.

A node the probe leaves out of its answer was not probed (the daemon ran out of descriptors, could
not resolve the name, cut the round short): that is the daemon's trouble, not evidence about the
node, so it neither counts as a failure nor clears one (issue 14). A probe that raises OSError is
the same for every node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import structlog

from supervisor.domain.cluster import ClusterSnapshot, NodeInfo
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

    def confirm_in(self, now: float) -> float | None:
        """Seconds until the earliest suspect's failures span ``confirm_s`` (0 when they do already),
        so the next probe can confirm it then rather than up to a tick later; None: no suspect."""
        if not self._failing:
            return None
        return max(0.0, min(first for first, _ in self._failing.values()) + self.confirm_s - now)

    def first_failures(self, nodes: Iterable[str]) -> dict[str, float]:
        """When each of ``nodes`` first failed a probe in its current run of failures (the onset
        a node fault's detection time is counted from); nodes not failing are left out."""
        return {n: self._failing[n][0] for n in nodes if n in self._failing}

    def update(self, nodes: Iterable[str], snap: ClusterSnapshot, now: float) -> dict[str, str]:
        """Probe ``nodes``; return the confirmed dead ones with their evidence."""
        if self.probe is None:
            return {}
        wanted = sorted(set(nodes))
        for name in set(self._failing) - set(wanted):
            del self._failing[name]  # no longer probed: forget its failures
        infos = [snap.nodes[n] for n in wanted if n in snap.nodes]
        results = self._probe(infos)
        not_run = len(infos) - len(results)
        if not_run:
            log.warning("probe_nodes_not_probed", nodes=not_run, probed=len(results))
        return self._judge(results, now)

    def _probe(self, infos: list[NodeInfo]) -> Mapping[str, str | None]:
        if not infos:
            return {}
        try:
            return self.probe.probe(infos) if self.probe is not None else {}
        except OSError as exc:  # the daemon's own trouble (descriptors, memory): no node's fault
            log.warning("probe_not_run", nodes=len(infos), error=f"{type(exc).__name__}: {exc}")
            return {}

    def _judge(self, results: Mapping[str, str | None], now: float) -> dict[str, str]:
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
        return dead
