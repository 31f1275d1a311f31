"""What the supervisor remembers of nodes: verdicts, faults (quarantine), node changes (blast
radius), operators' quarantine clears."""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from supervisor.adapters.sqlite.base import SqliteBase
from supervisor.domain.decide.blast import NodeChangeRecord
from supervisor.domain.health.findings import NodeFinding
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.records import NodeVerdict, Verdict


class SqliteNodes(SqliteBase):
    """Verdicts and faults are read every tick and written a few times a day: what was read is
    kept until this connection writes the table again (every writer below says so: ``_wrote``)
    or another connection commits."""

    def record_node_fault(self, fault: Fault) -> None:
        """Remember a fault pinned on a node (once per key)."""
        self._wrote("node_faults")
        self._db.execute(
            "INSERT OR IGNORE INTO node_faults(node, run, at, reason, source, key) VALUES (?, ?, ?, ?, ?, ?)",
            (
                fault.node,
                fault.run,
                fault.at,
                fault.reason,
                fault.source,
                fault.key or f"{fault.run}:{fault.node}:{fault.at}",
            ),
        )

    def node_faults(self, since: float) -> list[Fault]:
        """Faults pinned on a node, in every run, since ``since``, oldest first."""
        faults, times = self._kept_read("node_faults", self._all_faults)
        return faults[bisect_left(times, since) :]

    def _all_faults(self) -> tuple[list[Fault], list[float]]:
        rows = self._db.execute("SELECT node, at, run, reason, key, source FROM node_faults ORDER BY at, id").fetchall()
        faults = [_fault(*r) for r in rows]
        return faults, [f.at for f in faults]

    def clear_quarantine(self, node: str, now: float, by: str, note: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO quarantine_clears(node, at, by, note) VALUES (?, ?, ?, ?)", (node, now, by, note))

    def quarantine_clears(self) -> dict[str, float]:
        rows = self._db.execute("SELECT node, MAX(at) AS at FROM quarantine_clears GROUP BY node").fetchall()
        return {r["node"]: r["at"] for r in rows}

    def set_verdict(self, v: NodeVerdict) -> None:
        self._wrote("nodes")
        self._db.execute(
            "INSERT INTO nodes(name, verdict, reason, evidence, run, action, since, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET verdict = excluded.verdict,"
            " reason = excluded.reason, evidence = excluded.evidence, run = excluded.run,"
            " action = COALESCE(excluded.action, nodes.action), updated_at = excluded.updated_at",
            (v.node, v.verdict.value, v.reason, json.dumps(v.evidence), v.run, v.action, v.at, v.at),
        )

    def set_node_action(self, node: str, action: str, now: float) -> None:
        self._wrote("nodes")
        self._db.execute("UPDATE nodes SET action = ?, updated_at = ? WHERE name = ?", (action, now, node))

    def verdicts(self) -> list[NodeVerdict]:
        return list(self._kept_read("nodes", self._all_verdicts))

    def _all_verdicts(self) -> list[NodeVerdict]:
        rows = self._db.execute(
            "SELECT name, verdict, reason, evidence, run, action, since FROM nodes ORDER BY since, name"
        ).fetchall()
        return [_verdict(*r) for r in rows]

    def keep_findings(self, findings: Iterable[NodeFinding]) -> None:
        """The node findings active now: they replace the ones kept before."""
        with self.transaction() as db:
            db.execute("DELETE FROM node_findings")
            db.executemany(
                "INSERT OR REPLACE INTO node_findings(node, finding) VALUES (?, ?)",
                [(f.node, json.dumps(f.to_json(), default=str)) for f in findings],
            )

    def active_findings(self) -> dict[str, NodeFinding]:
        rows = self._db.execute("SELECT node, finding FROM node_findings ORDER BY node").fetchall()
        return {r["node"]: NodeFinding.from_json(json.loads(r["finding"])) for r in rows}

    def record_node_change(self, change: NodeChangeRecord) -> None:
        """Remember a DOWN or DRAIN this supervisor made (once per journaled intent)."""
        self._db.execute(
            "INSERT OR IGNORE INTO node_changes(node, run, change, at, reason, intent) VALUES (?, ?, ?, ?, ?, ?)",
            (change.node, change.run, change.change, change.at, change.reason, change.intent),
        )

    def node_changes(self, since: float) -> list[NodeChangeRecord]:
        """The node changes made since ``since``, oldest first (what the blast radius counts)."""
        rows = self._db.execute("SELECT * FROM node_changes WHERE at >= ? ORDER BY at, id", (since,)).fetchall()
        return [NodeChangeRecord.from_json(dict(r)) for r in rows]


@lru_cache(maxsize=4096, typed=True)
def _verdict(
    node: str, verdict: str, reason: str, evidence: str, run: str | None, action: str | None, since: Any
) -> NodeVerdict:
    """A stored verdict, decoded once per version of its row: the engine reads every verdict
    several times a tick, and a long run collects hundreds (its evidence is never modified)."""
    return NodeVerdict(node, Verdict(verdict), reason, json.loads(evidence), run, action, since)


@lru_cache(maxsize=4096, typed=True)
def _fault(node: str, at: float, run: str, reason: str, key: str, source: str) -> Fault:
    """A stored fault, decoded once: the quarantine reads every fault of its window each tick."""
    return Fault.from_json({"node": node, "at": at, "run": run, "reason": reason, "key": key, "source": source})
