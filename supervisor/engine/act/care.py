"""Each tick, each node on the remediation ladder (``node_care``) takes its next step.

``domain.health.ladder.step`` decides; this module carries the decided remedies out through the
node guard (``CareHands``, which alone holds node rights) as journaled, idempotent actions, keeps
the record the action leads to, and writes each rung to the logbook with its evidence.

Crash safety: an action is journaled (``begin_action``) before it is performed and completed as
soon as it was; the next record and the rung's logbook lines are then written in one transaction,
and a daemon killed before that finds the action done and does not perform it again. One killed
while the action was under way finds the intent still open after its restart; a REBOOT or a PAGE that may have happened is then taken as done, not
asked again (a second reboot would kill the first's validation; a second page is noise), while the
idempotent guard remedies (RESERVE, RESUME, DRAIN, UNRESERVE, VALIDATE's submission) are asked
again. The journal's key (``CareAction.key``) names the node, the rung and when it was reached, so
one rung acts once.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog

from supervisor.domain.health.ladder import CareAction, CareOp, CareStep, LadderSettings, NodeCare, kept_out, step
from supervisor.domain.records import Event, EventKind
from supervisor.ports import CareHands, Clock, PortError, Store

log = structlog.get_logger("supervisor.engine")

NOT_REPEATED = frozenset({CareOp.REBOOT, CareOp.PAGE})  # an open intent of these is taken as done
KIND = "node_care"  # the journal's kind for ladder actions


def journal_run(node: str) -> str:
    """The journal's and the logbook's run column for a node's ladder (a node is no run)."""
    return f"node:{node}"


class NodeCareKeeper:
    def __init__(self, *, store: Store, hands: CareHands, clock: Clock, settings: LadderSettings) -> None:
        self.store = store
        self.hands = hands
        self.clock = clock
        self.settings = settings
        self._settled = False

    def tick(self) -> None:
        """One step for every node on the ladder."""
        if not self._settled:
            self._settle_open_intents()
            self._settled = True
        for care in self.store.node_cares().values():
            self.step_node(care)

    def kept_out(self, run_nodes: int) -> frozenset[str]:
        """The nodes a run of ``run_nodes`` nodes may not use now (on the ladder or needs repair)."""
        return kept_out(self.store.node_cares().values(), run_nodes, self.settings)

    def step_node(self, care: NodeCare) -> None:
        now = self.clock.now()
        seen = self.hands.seen(care.node)
        verdict = self.hands.verdict(care.node) if care.rung == "validating" else None
        decided = step(care, seen, verdict, self.settings, now)
        for action in decided.actions:
            if not self._carry_out(action):
                return  # the rest waits for the next tick; the record stays where it stood
        self._settle(care, decided, now)

    def _carry_out(self, action: CareAction) -> bool:
        params = _params(action)
        run = journal_run(action.node)
        if self.store.action_done(run, KIND, params):
            return True
        intent = self.store.begin_action(run, KIND, params, self.clock.now())
        try:
            self.hands.remedy(action.op, action.node, action.why)
        except PortError as exc:
            log.warning("node_care_refused", node=action.node, op=action.op.value, error=str(exc))
            self.store.complete_action(intent, "failed", {"error": str(exc)[:500]}, self.clock.now())
            return False
        self.store.complete_action(intent, "done", {}, self.clock.now())
        return True

    def _settle_open_intents(self) -> None:
        """After a restart: an open REBOOT or PAGE may have happened, so it counts as done (never
        asked twice); any other open remedy is idempotent and marked failed, to be asked again."""
        for intent in self.store.open_actions():
            if intent.kind != KIND:
                continue
            done = intent.params.get("op") in NOT_REPEATED
            status, result = ("done", {"recovered": True}) if done else ("failed", {"error": "daemon restarted"})
            self.store.complete_action(intent.id, status, result, self.clock.now())

    def _settle(self, before: NodeCare, decided: CareStep, now: float) -> None:
        """The record the last action leads to (or the step's own), and the logbook lines."""
        after = next((a.then for a in reversed(decided.actions) if a.then is not None), decided.care)
        with self.store.transaction():
            if after is None:
                self.store.drop_node_care(before.node)
            elif after != before:
                self.store.keep_node_care(after, now)
            for event in _events(decided, before, now):
                self.store.record_event(event)


def _params(action: CareAction) -> dict[str, Any]:
    return {"node": action.node, "op": action.op.value, "key": action.key}


def _events(decided: CareStep, before: NodeCare, now: float) -> Iterable[Event]:
    for note in decided.notes:
        key = f"care:{note.node}:{note.rung}:{before.since:.0f}:{before.rung}"
        yield Event(
            journal_run(note.node), EventKind.NODE_CARE, note.message, key, at=now, evidence=dict(note.evidence)
        )
