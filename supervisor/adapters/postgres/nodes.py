"""What the supervisor remembers of nodes: verdicts, faults (quarantine), node changes (blast
radius), operators' quarantine clears."""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from supervisor.adapters.postgres.base import PostgresBase
from supervisor.domain.decide.blast import NodeChangeRecord
from supervisor.domain.health.findings import NodeFinding
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.records import NodeVerdict, Verdict

_VERDICT = (
    "INSERT INTO nodes(name, verdict, reason, evidence, run, action, since, updated_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET verdict = excluded.verdict,"
    " reason = excluded.reason, evidence = excluded.evidence, run = excluded.run,"
    " action = COALESCE(excluded.action, nodes.action), updated_at = excluded.updated_at"
)


class PostgresNodes(PostgresBase):
    """Each row is decoded once per version of it (``_verdict``, ``_fault``): the engine reads every
    verdict and the quarantine's faults several times a tick; rows are read again, not kept, as
    another login node's store may have written them."""

    def record_node_fault(self, fault: Fault) -> None:
        """Remember a fault pinned on a node (once per key)."""
        f = fault
        self._write(
            "INSERT INTO node_faults(node, run, at, reason, source, key) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (key) DO NOTHING",
            (f.node, f.run, f.at, f.reason, f.source, f.key or f"{f.run}:{f.node}:{f.at}"),
        )

    def node_faults(self, since: float) -> list[Fault]:
        """Faults pinned on a node, in every run, since ``since``, oldest first."""
        rows = self._all(
            "SELECT node, at, run, reason, key, source FROM node_faults WHERE at >= %s ORDER BY at, id", (since,)
        )
        return [_fault(*r.values()) for r in rows]

    def clear_quarantine(self, node: str, now: float, by: str, note: str) -> None:
        self._write(
            'INSERT INTO quarantine_clears(node, at, "by", note) VALUES (%s, %s, %s, %s)', (node, now, by, note)
        )

    def quarantine_clears(self) -> dict[str, float]:
        rows = self._all("SELECT node, MAX(at) AS at FROM quarantine_clears GROUP BY node", ())
        return {r["node"]: r["at"] for r in rows}

    def set_verdict(self, v: NodeVerdict) -> None:
        self._write(_VERDICT, (v.node, v.verdict.value, v.reason, json.dumps(v.evidence), v.run, v.action, v.at, v.at))

    def set_node_action(self, node: str, action: str, now: float) -> None:
        self._write("UPDATE nodes SET action = %s, updated_at = %s WHERE name = %s", (action, now, node))

    def verdicts(self) -> list[NodeVerdict]:
        rows = self._all(
            "SELECT name, verdict, reason, evidence, run, action, since FROM nodes ORDER BY since, name", ()
        )
        return [_verdict(*r.values()) for r in rows]

    def keep_findings(self, findings: Iterable[NodeFinding]) -> None:
        """The node findings active now: they replace the ones kept before."""
        rows = {f.node: json.dumps(f.to_json(), default=str) for f in findings}  # the last of a node wins
        with self.transaction() as db:
            db.execute("DELETE FROM node_findings")
            if rows:
                self._write_many("INSERT INTO node_findings(node, finding) VALUES (%s, %s)", list(rows.items()))

    def active_findings(self) -> dict[str, NodeFinding]:
        rows = self._all("SELECT node, finding FROM node_findings ORDER BY node", ())
        return {r["node"]: NodeFinding.from_json(json.loads(r["finding"])) for r in rows}

    def record_node_change(self, change: NodeChangeRecord) -> None:
        """Remember a DOWN or DRAIN this supervisor made (once per journaled intent)."""
        c = change
        self._write(
            "INSERT INTO node_changes(node, run, change, at, reason, intent) VALUES (%s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (intent) DO NOTHING",
            (c.node, c.run, c.change, c.at, c.reason, c.intent),
        )

    def node_changes(self, since: float) -> list[NodeChangeRecord]:
        """The node changes made since ``since``, oldest first (what the blast radius counts)."""
        rows = self._all("SELECT * FROM node_changes WHERE at >= %s ORDER BY at, id", (since,))
        return [NodeChangeRecord.from_json(r) for r in rows]


@lru_cache(maxsize=4096, typed=True)
def _verdict(
    node: str, verdict: str, reason: str, evidence: str, run: str | None, action: str | None, since: Any
) -> NodeVerdict:
    """A stored verdict, decoded once per version of its row (its evidence is never modified)."""
    return NodeVerdict(node, Verdict(verdict), reason, json.loads(evidence), run, action, since)


@lru_cache(maxsize=4096, typed=True)
def _fault(node: str, at: float, run: str, reason: str, key: str, source: str) -> Fault:
    """A stored fault, decoded once: the quarantine reads every fault of its window each tick."""
    return Fault.from_json({"node": node, "at": at, "run": run, "reason": reason, "key": key, "source": source})
