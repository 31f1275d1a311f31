"""GPU health rules: from what a node reports (``NodeReport``) to findings (``NodeFinding``).

An open, versioned table (domain.health.gpu_table; what a report shows of it: domain.health.gpu_conditions). Each
rule has an id (``xid-79``), a severity, a reason and a persistence: how many consecutive reports
must show the condition before it fires. A rule id carries the table version (``xid-79@1``), so a
logbook entry says which table judged it.

Hysteresis: a fired condition stays latched (it does not fire again) until it has been absent
for ``clear_samples`` consecutive reports; a watch-level condition fires only once it has been
present for ``persist_samples`` consecutive reports. Events (XIDs) are present in the report
that carries them. Hard evidence (fatal, and degraded counters) fires on the first report.

Pure: ``HealthRules`` keeps per-node state in memory and is fed reports and the time they were
received; nothing here reads a clock or logs. That memory is bounded: at most ``max_nodes`` nodes,
the one heard from least recently forgotten first (its hysteresis starts afresh if it reports
again) — the ingest forgets ended runs' nodes itself; the cap is the second line.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from supervisor.domain.health.findings import NodeFinding
from supervisor.domain.health.gpu_conditions import report_conditions
from supervisor.domain.health.gpu_table import Condition, GpuHealthSettings
from supervisor.domain.health.node_report import NodeReport

RULES_VERSION = 1
MAX_NODES = 16_384  # nodes whose state is kept (a large cluster's worth)

_TrackKey = tuple[str, int | None, str]  # rule, GPU, PCI bus (for an XID on no known GPU)


@dataclass
class _Track:
    present: int = 0
    absent: int = 0
    fired: bool = False


@dataclass
class _NodeState:
    last: NodeReport | None = None
    tracks: dict[_TrackKey, _Track] = field(default_factory=dict)


class HealthRules:
    """The table applied with hysteresis, per node. Feed it each accepted report in order."""

    def __init__(self, settings: GpuHealthSettings | None = None, max_nodes: int = MAX_NODES) -> None:
        self.settings = settings or GpuHealthSettings()
        self.max_nodes = max(1, max_nodes)
        self._nodes: OrderedDict[str, _NodeState] = OrderedDict()

    @property
    def tracked(self) -> int:
        """How many nodes' state is kept."""
        return len(self._nodes)

    def evaluate(self, report: NodeReport, now: float, run: str | None = None) -> list[NodeFinding]:
        state = self._state(report.node)
        conditions = report_conditions(report, state.last, self.settings)
        state.last = report
        return [self._finding(report, c, now, run) for c in self._step(state, conditions)]

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)

    def _state(self, node: str) -> _NodeState:
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = _NodeState()
            while len(self._nodes) > self.max_nodes:
                self._nodes.popitem(last=False)
        else:
            self._nodes.move_to_end(node)
        return state

    def active(self, node: str) -> list[str]:
        """Rule ids (with the GPU) currently latched for ``node``."""
        state = self._nodes.get(node)
        return sorted(
            f"{r}@{RULES_VERSION}" + (f"/gpu{g}" if g is not None else f"/{bus}" if bus else "")
            for (r, g, bus), t in (state.tracks.items() if state else ())
            if t.fired
        )

    def _step(self, state: _NodeState, conditions: Iterable[Condition]) -> list[Condition]:
        fire: list[Condition] = []
        seen: set[_TrackKey] = set()
        for c in conditions:
            key = (c.rule, c.gpu, str(c.evidence.get("bus", "")) if c.gpu is None else "")
            if key in seen:
                continue  # several XIDs of one kind in one report count once
            seen.add(key)
            if self._present(state.tracks.setdefault(key, _Track()), c):
                fire.append(c)
        for key in [k for k in state.tracks if k not in seen]:
            if self._absent(state.tracks[key]):
                del state.tracks[key]
        return fire

    @staticmethod
    def _present(track: _Track, c: Condition) -> bool:
        """Count one more report showing ``c``; whether it fires now."""
        track.present += 1
        track.absent = 0
        if track.fired or track.present < c.persist:
            return False
        track.fired = True
        return True

    def _absent(self, track: _Track) -> bool:
        """Count one more report without the condition; whether its track can be dropped (re-armed)."""
        track.present = 0
        track.absent += 1
        return not track.fired or track.absent >= self.settings.clear_samples

    @staticmethod
    def _finding(report: NodeReport, c: Condition, now: float, run: str | None) -> NodeFinding:
        evidence = {**c.evidence, "report_seq": report.seq, "report_at": report.at}
        return NodeFinding(
            node=report.node,
            severity=c.severity,
            reason=c.reason,
            rule=f"{c.rule}@{RULES_VERSION}",
            at=now,
            source=report.source,
            run=run,
            evidence=evidence,
        )
