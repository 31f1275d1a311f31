"""The bad-node memory (``domain.health.quarantine``) judged on a replayed fault trace.

Every node-level fault of the trace is fed, in time order, to the real ``quarantined`` rule, as the
node guard's shared memory would learn it (it remembers every run's faults). Two figures weigh it:

* **faults avoided** — a node faulted again while it was quarantined: a run kept it out, so the
  fault did not strike a run (of ``repeat_faults``, the faults on a node that had faulted before:
  the most any memory of past faults could avoid);
* **node-days held out while healthy** — time a node was quarantined but not under repair (between
  a fault's start and its repair end): capacity the memory cost.

Pure: no clock, no store; the same trace and settings give the same figures.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from supervisor.domain.health.quarantine import Fault, QuarantineSettings, quarantined
from supervisor.sim.faults.fault_trace import FaultTrace, TraceFault

DAY_S = 86400.0
Span = tuple[float, float]


@dataclass(frozen=True)
class QuarantineJudgement:
    node_faults: int  # node-level faults within the horizon
    repeat_faults: int  # on a node that had faulted before
    faults_avoided: int  # the node was quarantined when it faulted again
    nodes_quarantined: int  # nodes quarantined at least once
    node_days_quarantined: float
    node_days_held_out_healthy: float  # quarantined while not under repair

    def to_json(self) -> dict[str, float | int]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


def judge(
    trace: FaultTrace, horizon_s: float, settings: QuarantineSettings = QuarantineSettings()
) -> QuarantineJudgement:
    by_node: dict[str, list[TraceFault]] = {}
    for f in trace.faults:
        if f.start_s < horizon_s and f.cause.shows.node_level:
            by_node.setdefault(f.node, []).append(f)
    avoided = repeats = quarantined_nodes = 0
    held = healthy = 0.0
    for node, faults in by_node.items():
        hits, spans = _replay(node, faults, horizon_s, settings)
        avoided += hits
        repeats += len(faults) - 1
        quarantined_nodes += bool(spans)
        repairs = [(f.start_s, min(horizon_s, f.end_s if f.end_s is not None else f.start_s)) for f in faults]
        held += _length(spans)
        healthy += _length(spans) - _overlap(spans, _merge(repairs))
    return QuarantineJudgement(
        sum(len(fs) for fs in by_node.values()),
        repeats,
        avoided,
        quarantined_nodes,
        held / DAY_S,
        healthy / DAY_S,
    )


def _replay(
    node: str, faults: Sequence[TraceFault], horizon_s: float, settings: QuarantineSettings
) -> tuple[int, list[Span]]:
    """(faults that struck the node while it was quarantined, the spans it was quarantined).
    Between two faults the memory's verdict is the one after the first: each span ends at the
    node's next fault, where the rule is asked again."""
    history = [Fault(node, f.start_s, "trace", f.cause.component, key=str(i)) for i, f in enumerate(faults)]
    ats = [f.start_s for f in faults]
    hits = 0
    spans: list[Span] = []
    for i, f in enumerate(faults):
        if i and node in quarantined(_recent(history, ats, i, settings.window_s), {}, f.start_s, settings):
            hits += 1
        verdict = quarantined(_recent(history, ats, i + 1, settings.window_s), {}, f.start_s, settings).get(node)
        if verdict is not None:
            next_fault = faults[i + 1].start_s if i + 1 < len(faults) else horizon_s
            spans.append((f.start_s, min(verdict.until, next_fault, horizon_s)))
    return hits, _merge(spans)


def _recent(history: Sequence[Fault], ats: Sequence[float], upto: int, window_s: float) -> Sequence[Fault]:
    """``history[:upto]`` less the faults the rule ignores (older than its window before the
    newest): the same verdict, without rereading a long history at every fault."""
    first = bisect.bisect_left(ats, ats[upto - 1] - window_s, 0, upto)
    return history[first:upto]


def _merge(spans: Iterable[Span]) -> list[Span]:
    out: list[Span] = []
    for lo, hi in sorted(s for s in spans if s[1] > s[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _length(spans: Sequence[Span]) -> float:
    return sum(hi - lo for lo, hi in spans)


def _overlap(a: Sequence[Span], b: Sequence[Span]) -> float:
    """How long two merged span lists overlap."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total
