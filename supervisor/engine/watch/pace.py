"""Stragglers and slowdowns of one attempt, from the records of its log.

* Per-rank step times (the JSONL protocol's ``rank_step_times``; ``record.per_rank_step_time_s``)
  are folded into per-node times — ranks are laid out in blocks over the job's nodes in Slurm's
  order, as ``srun``'s default block distribution does — and scored across nodes
  (``domain.pace.stragglers.StragglerScorer``: robust z, CUSUM). A node named is a *degraded* finding:
  the engine keeps it out from the next restart, or restarts at the next verified checkpoint and
  drains it then — work since the last checkpoint is not thrown away for a 5 % slowdown. With the
  record's ``rank_peer_groups`` (pipeline stages) a node is compared only with its peers; without
  them, nodes slower together from the start (a stage) are learned as a block: an *imbalance*,
  logged once as a note, never drained (``domain.pace.peer_groups``).
* Throughput (tokens/s, samples/s, else 1 / step time) against the attempt's own baseline
  (``SlowdownDetector``): a sustained drop is reported once per attempt, with the straggler that
  explains it when one was named.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from supervisor.domain.health.findings import NodeFinding, Severity
from supervisor.domain.pace.peer_groups import Imbalance
from supervisor.domain.pace.slowdown import SlowdownDetector, SlowdownState
from supervisor.domain.pace.stragglers import (
    StragglerScorer,
    node_peer_groups,
    node_step_times,
)
from supervisor.domain.progress import ProgressRecord
from supervisor.domain.records import Event, EventKind, RunRecord

STRAGGLER_RULE = "straggler@1"


@dataclass
class Pace:
    run: str
    nodes: tuple[str, ...]
    scorer: StragglerScorer | None = None
    slowdown: SlowdownDetector = field(default_factory=SlowdownDetector)
    named: dict[str, NodeFinding] = field(default_factory=dict)
    slow_reported: bool = False
    groups: tuple[int, ...] | None = None  # the rank peer groups the scorer was built with
    imbalances_reported: bool = False

    def feed(self, record: ProgressRecord, now: float) -> tuple[list[NodeFinding], dict[str, Any] | None]:
        """New straggler findings, and the slowdown evidence when the drop is first sustained."""
        return self._stragglers(record, now), self._slowdown(record)

    def _stragglers(self, record: ProgressRecord, now: float) -> list[NodeFinding]:
        ranks = record.per_rank_step_time_s
        if not ranks or not self.nodes or len(ranks) % len(self.nodes):
            return []
        per_node = len(ranks) // len(self.nodes)
        groups = (
            record.rank_peer_groups if record.rank_peer_groups and len(record.rank_peer_groups) == len(ranks) else None
        )
        if self.scorer is None or (groups is not None and groups != self.groups):
            if len(self.nodes) < 3:
                return []  # a median of two says nothing
            node_groups = node_peer_groups(groups, per_node) if groups is not None else None
            self.scorer = StragglerScorer(len(self.nodes), self.nodes, groups=node_groups)
            self.groups, self.imbalances_reported = groups, False
        times = node_step_times(np.asarray(ranks, dtype=np.float64), per_node)
        new = []
        for v in self.scorer.update(times):
            if v.name in self.named:
                continue
            finding = NodeFinding(
                v.name,
                Severity.DEGRADED,
                f"straggler: {v.reason}",
                STRAGGLER_RULE,
                now,
                "progress",
                self.run,
                {
                    "slowdown": round(v.slowdown, 4),
                    "score": round(v.score, 2),
                    "steps_observed": v.steps_observed,
                    "step": record.step,
                    "compared_with": v.compared_with,
                },
            )
            self.named[v.name] = finding
            new.append(finding)
        return new

    def take_imbalances(self) -> tuple[Imbalance, ...]:
        """The start-up imbalances the scorer learned, once per scorer (then nothing)."""
        if self.scorer is None or self.scorer.learning or self.imbalances_reported:
            return ()
        self.imbalances_reported = True
        return self.scorer.imbalances

    def _slowdown(self, record: ProgressRecord) -> dict[str, Any] | None:
        rate = record.tokens_per_s or record.samples_per_s
        if rate is None and record.step_time_s:
            rate = 1.0 / record.step_time_s
        if rate is None or self.slow_reported:
            return None
        verdict = self.slowdown.update(rate)
        if verdict.state is not SlowdownState.SLOW:
            return None
        self.slow_reported = True
        return {
            "reason": verdict.reason,
            "baseline": verdict.baseline,
            "recent": verdict.recent,
            "drop": round(verdict.drop or 0.0, 4),
            "step": record.step,
            "stragglers": {n: f.reason for n, f in self.named.items()},
        }


def imbalance_events(
    runs: Iterable[RunRecord], taken: list[tuple[str, tuple[int, int], Imbalance]], now: float
) -> list[Event]:
    """A logbook note per imbalance of the current attempts: nodes slower together from the start
    (a pipeline stage), reported, never drained."""
    by_name = {r.name: r for r in runs}
    out = []
    for name, key, imb in taken:
        run = by_name.get(name)
        a = run.attempt if run else None
        if a is None or (a.job_id, a.restart_count) != key:
            continue
        evidence = {"nodes": list(imb.names[:256]), "level": round(imb.level, 4), "steps": imb.steps}
        message = f"{a.label}: imbalance: {imb.reason}"
        out.append(
            Event(
                name,
                EventKind.NOTE,
                message,
                f"{name}:{a.seq}:imbalance:{imb.names[0]}",
                now,
                a.seq,
                a.job_id,
                evidence=evidence,
            )
        )
    return out
