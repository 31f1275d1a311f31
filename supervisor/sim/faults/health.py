"""``SimHealthFeed``: the ``HealthFeed`` port as the node agents would fill it for simulated faults.

A node agent samples NVML and the IB counters every ``sample_s`` seconds and heartbeats on each
sample; so a GPU fault at ``t`` is reported as a finding at the agent's first sample after ``t``
(``t + phase × sample_s``), and a dead host stops heartbeating at ``t``. Findings are queued on
the virtual clock and handed out once their time has come, oldest first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.sim.clock import VirtualClock
from supervisor.sim.faults.failures import Category, Manifestation

_RULES = {
    Manifestation.XID: ("xid-{xid}@sim", "XID {xid}: GPU fault ({component})"),
    Manifestation.ECC: ("ecc-uncorrectable@sim", "uncorrectable ECC error, XID {xid} ({component})"),
    Manifestation.NIC: ("ib-port-down@sim", "InfiniBand port down ({component})"),
    Manifestation.STRAGGLER: ("gpu-clocks-throttled@sim", "GPU clocks throttled: node runs slow ({component})"),
}


class SimHealthFeed:
    def __init__(self, clock: VirtualClock, nodes: Iterable[str], sample_s: float = 10.0) -> None:
        self.clock = clock
        self.sample_s = sample_s
        self._ready: list[NodeFinding] = []
        self._last_beat = {name: clock.now() for name in nodes}
        self._silent: dict[str, float] = {}  # node -> when its agent stopped
        self.emitted: list[NodeFinding] = []

    # -- the simulator's side -------------------------------------------------------------------

    def fault(self, node: str, category: Category, at: float, phase: float, run: str | None = None) -> float | None:
        """A failure of ``category`` on ``node`` at ``at``; returns when the agent reports it."""
        shows = category.shows
        if shows is Manifestation.HOST_DOWN:
            self._silent[node] = at
            return None
        if shows not in _RULES:
            return None  # nothing a node agent can see (software, fabric, silent corruption, hangs)
        rule, text = _RULES[shows]
        values = {"xid": category.xid or 0, "component": category.component}
        severity = Severity.DEGRADED if shows is Manifestation.STRAGGLER else Severity.FATAL
        when = at + phase * self.sample_s
        finding = NodeFinding(
            node,
            severity,
            text.format(**values),
            rule.format(**values),
            when,
            "sim",
            run,
            {"category": category.component, "xid": category.xid, "fault_at": at},
        )
        self.clock.call_at(when, self._arrive, finding)
        return when

    def _arrive(self, finding: NodeFinding) -> None:
        self._ready.append(finding)

    def repaired(self, node: str) -> None:
        self._silent.pop(node, None)
        self._last_beat[node] = self.clock.now()

    # -- the HealthFeed port --------------------------------------------------------------------

    def drain_findings(self) -> list[NodeFinding]:
        out, self._ready = self._ready, []
        self.emitted.extend(out)
        return out

    def heartbeat_ages(self, now: float) -> Mapping[str, float]:
        # A live agent beat at its last sample: at most one sample interval ago. (One pass over
        # the thousands of live agents, then the few silent ones: this runs every tick.)
        sample = self.sample_s
        ages = {name: min(sample, now - beat) for name, beat in self._last_beat.items()}
        for name, stopped in self._silent.items():
            if name in ages:
                ages[name] = now - stopped
        return ages
