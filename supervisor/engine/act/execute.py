"""The one place that writes: records applied to the store, actions journaled and performed.

``Executor.apply(records)`` writes typed records and logbook events (it is the only caller of the
logbook writer); ``Executor.act(run, action)`` journals an intent, performs it through a port and
marks it done, with what follows from it (a new attempt, a node change on record, the logbook
line). ``settle_open_intents`` completes what a previous daemon left open. Crash-only: every step
is idempotent and a crash between any two is settled by the next tick.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import structlog

from supervisor.domain.actions import (
    Action,
    Cancel,
    ChangeNode,
    Fence,
    Record,
    Release,
    SetExcluded,
    StartSuccessor,
    Submit,
    SuccessorSet,
    SwapStep,
)
from supervisor.domain.checkpoints.resume import ResumePlan, describe_plan
from supervisor.domain.checkpoints.signing import manifest_key
from supervisor.domain.cluster import ClusterSnapshot, NodeChange
from supervisor.domain.decide.blast import NodeChangeRecord
from supervisor.domain.records import Event, EventKind, RunRecord, Successor
from supervisor.domain.run import RunState
from supervisor.engine.act import intents
from supervisor.engine.act.intents import action_from, effect_present, params_of, submit_request, submit_tag
from supervisor.engine.act.record_writer import write_record
from supervisor.engine.act.swaps import goal_written, swap_done, write_goal
from supervisor.ports import (
    CapReached,
    Clock,
    Fencer,
    NodeGuard,
    PermanentError,
    PermissionDenied,
    PortError,
    Scheduler,
    Store,
    TransientError,
)

log = structlog.get_logger("supervisor.engine")

CrashHook = Callable[[str, str], None]  # (boundary, action kind) -> may raise or exit


class ResumeFor(Protocol):
    """The plan a new attempt is handed; ``in_job``: a relaunch in the same job (peer copies in its
    nodes' memory may be named)."""

    def __call__(self, run: RunRecord, *, in_job: bool = False) -> ResumePlan | None: ...


REFUSED_FOR_S = 600.0  # a node change the node guard refused is not asked for again this long


class Executor:
    def __init__(
        self,
        *,
        scheduler: Scheduler,
        store: Store,
        clock: Clock,
        fencer: Fencer | None,
        resume_for: ResumeFor,
        ingest_url: str | None = None,
        node_rights: bool = True,
        crash_hook: CrashHook | None = None,
        guard: NodeGuard | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.store = store
        self.clock = clock
        self.fencer = fencer
        self.resume_for = resume_for
        self.ingest_url = ingest_url
        self.node_rights = node_rights  # False once Slurm refused a node change: not asked again
        self._crash = crash_hook or (lambda boundary, kind: None)
        self.own_uid = os.getuid()  # a tagged job is the one a submission made only when it is this user's
        self.guard = guard  # node changes go through the node guard when a site runs one
        self.capped_until = 0.0  # the guard's cluster-wide cap is spent until then
        self._refused: dict[str, float] = {}  # node -> when the guard last refused changing it

    def guard_capped(self, now: float) -> bool:
        """The node guard said its cluster-wide cap is spent (until a drain leaves its window)."""
        return now < self.capped_until

    # ------------------------------------------------------------------ records

    def apply(self, records: Sequence[Record]) -> None:
        """Write the records, in order, in one transaction."""
        if not records:
            return
        now = self.clock.now()
        with self.store.transaction():
            for rec in records:
                write_record(self.store, rec, now)

    # ------------------------------------------------------------------ actions

    def carry_out(self, run: RunRecord, actions: tuple[Action, ...]) -> bool:
        """Perform the decision's actions in order, each on the run as it stands then. True when
        anything was done."""
        if not actions:  # most runs, most ticks: no read of the run again
            return False
        acted = False
        fresh = self.store.get_run(run.name) or run
        for action in actions:
            if isinstance(action, ChangeNode) and not self._may_ask(action.node):
                continue  # refused already; the node stays excluded
            self.act(fresh, action)
            acted = True
            fresh = self.store.get_run(run.name) or fresh
        return acted

    def _may_ask(self, node: str) -> bool:
        """Not when Slurm refused a node change in this daemon's life, nor when the guard refused
        one for this node within REFUSED_FOR_S."""
        return self.node_rights and self.clock.now() - self._refused.get(node, float("-inf")) > REFUSED_FOR_S

    def act(self, run: RunRecord, action: Action) -> None:
        if isinstance(action, Submit):
            # Chosen before the intent is journaled: a retried submission hands the same checkpoint.
            action = replace(action, resume=self.resume_for(run), nonce=intents.new_nonce())
        elif isinstance(action, SwapStep | StartSuccessor):  # likewise: the same checkpoint on a retry
            action = replace(action, resume=self.resume_for(run, in_job=isinstance(action, SwapStep)))
        params = params_of(action)
        if isinstance(action, Fence) and self.store.action_done(run.name, action.kind, params):
            return
        self._crash("before_intent", action.kind)
        intent = self.store.begin_action(run.name, action.kind, params, self.clock.now())
        log.info("intent", intent=intent, action=action.kind.value, **_loggable(params))
        self._crash("after_intent", action.kind)
        self._perform_and_complete(run, intent, action)

    def _perform_and_complete(self, run: RunRecord, intent: int, action: Action) -> None:
        try:
            outcome = self._perform(run, intent, action)
        except PermissionDenied as exc:
            self._fail(run, intent, action, exc)
            if isinstance(action, ChangeNode):
                self.node_rights = False
            return
        except TransientError:
            raise  # the intent stays open; the next tick settles it against Slurm
        except CapReached as exc:
            self._capped(run, intent, action, exc)
            return
        except PermanentError as exc:
            self._fail(run, intent, action, exc)
            if isinstance(action, ChangeNode) and self.guard is not None:
                self._refused[action.node] = self.clock.now()
            return
        self._crash("after_execute", action.kind)
        self._complete(run, intent, action, outcome)
        self._crash("after_complete", action.kind)

    def _perform(self, run: RunRecord, intent: int, action: Action) -> dict[str, Any]:
        sched = self.scheduler
        if isinstance(action, Submit):
            seq = (run.attempt.seq + 1) if run.attempt else 0
            tag = submit_tag(run.name, self.store.instance_id, intent, action.nonce)
            url = self.ingest_url
            token = self.store.run_token(run.name) if url else None
            key = manifest_key(self.store.run_token(run.name)) if run.spec.checkpoints is not None else None
            request = submit_request(run.spec, action, tag, seq, token=token, ingest_url=url, manifest_key=key)
            return {"job_id": sched.submit(request)}
        if isinstance(action, StartSuccessor):  # the resume file was rewritten (resume_for) before this
            sched.set_excluded(action.job_id, action.exclude)
            sched.release(action.job_id)
            return {"job_id": action.job_id}
        if isinstance(action, Cancel):
            sched.cancel(action.job_id)
        elif isinstance(action, ChangeNode) and self.guard is not None:
            self.guard.set_node_state(action.node, action.change, run.name, action.reason)
        elif isinstance(action, ChangeNode):
            sched.set_node_state(action.node, action.change, action.reason)
        elif isinstance(action, SetExcluded):
            sched.set_excluded(action.job_id, action.nodes)
        elif isinstance(action, Release):
            sched.release(action.job_id)
        elif isinstance(action, Fence):
            assert self.fencer is not None
            self.fencer.fence(action.node)
        elif isinstance(action, SwapStep):
            return write_goal(self.store, run.name, action, self.clock.now())
        return {}

    def _complete(self, run: RunRecord, intent: int, action: Action, outcome: Mapping[str, Any]) -> None:
        now = self.clock.now()
        with self.store.transaction():
            self.store.complete_action(intent, "done", outcome, now)
            if isinstance(action, Submit) and action.after_job is not None:
                self.apply(prequeued(run, action, int(outcome["job_id"]), now))
            elif isinstance(action, Submit):
                self._submitted(run, action, int(outcome["job_id"]), now)
            elif isinstance(action, StartSuccessor):
                self._successor_started(run, action, outcome, now)
            elif isinstance(action, ChangeNode):
                self._node_changed(run, intent, action, now)
            elif isinstance(action, SwapStep):
                self.apply(swap_done(self.store, run, action, now))
            else:
                self.apply(_done_events(run, action, now))

    def _successor_started(
        self, run: RunRecord, action: StartSuccessor, outcome: Mapping[str, Any], now: float
    ) -> None:
        self.store.drop_successor(run.name, action.job_id)
        if not outcome.get("job_gone"):  # gone (cancelled by hand): the next tick submits anew
            self._submitted(run, action, action.job_id, now)

    def _submitted(self, run: RunRecord, action: Submit | StartSuccessor, job_id: int, now: float) -> None:
        s, replaced = self.store, run.attempt
        restart = isinstance(action, Submit) and action.restart
        new = s.add_attempt(run.name, job_id, 0, now, action.exclude)
        s.set_state(run.name, RunState.QUEUED, now, spend_restart=restart)
        s.rollbacks_done(run.name, new.seq)  # the new attempt carries out any planned rollback
        if action.resume is not None:
            s.record_resume_plan(run.name, new.seq, action.resume)
        kind = EventKind.RESTARTED if restart else EventKind.SUBMITTED
        verb = (
            "restarted as" if restart else ("pre-queued as" if isinstance(action, StartSuccessor) else "submitted as")
        )
        excl = f", excluding {','.join(action.exclude)}" if action.exclude else ""
        resume = f"; {describe_plan(action.resume)}" if action.resume is not None else ""
        evidence: dict[str, Any] = {
            "exclude": list(action.exclude),
            "reason": action.reason,
            "restarts_spent": run.restarts_spent + int(restart),
        }
        if action.resume is not None:  # the plan as JSON, for the logbook, chronicle and goodput readers
            evidence["resume"] = action.resume.to_json()
            evidence["resume_step"] = action.resume.step
        if replaced is not None:  # what the replaced attempt had reached (lost work, for people)
            evidence["last_step"] = replaced.last_step
            evidence["step_time_s"] = replaced.step_time_s
            evidence["save_s"] = replaced.save_s  # Young/Daly's save cost, as this attempt's log showed it
        message = f"{new.label}: {verb} job {new.job_id}{excl} ({action.reason}){resume}"
        key = f"{run.name}:{new.seq}:{kind.value}:"
        self.apply([Event(run.name, kind, message, key, now, new.seq, new.job_id, evidence=evidence)])

    def _node_changed(self, run: RunRecord, intent: int, action: ChangeNode, now: float) -> None:
        s = self.store
        s.set_node_action(action.node, "drained" if action.change is NodeChange.DRAIN else "down", now)
        if action.change in (NodeChange.DOWN, NodeChange.DRAIN):  # what the blast radius counts
            s.record_node_change(
                NodeChangeRecord(action.node, run.name, action.change.value, now, action.reason, intent)
            )
        if action.change is NodeChange.DRAIN:
            message = f"{action.node} downed and drained in Slurm: {action.reason}"
            event = run_event(run, EventKind.NODE_DRAINED, message, f"{run.name}:node_drained:{action.node}", now)
            self.apply([replace(event, evidence={"node": action.node, "reason": action.reason})])

    def _fail(self, run: RunRecord, intent: int, action: Action, exc: PortError) -> None:
        now = self.clock.now()
        log.warning("action_failed", action=action.kind.value, error=str(exc))
        kind = EventKind.NODE_EXCLUDED if isinstance(action, ChangeNode) else EventKind.WARNING
        what = f"could not {action.kind.value.replace('_', ' ')}"
        if isinstance(action, ChangeNode):
            what = f"{action.node} excluded from the run; could not set it {action.change.value}"
        event = run_event(run, kind, f"{what}: {exc}", f"{run.name}:failed-intent:{intent}", now)
        with self.store.transaction():
            self.store.complete_action(intent, "failed", {"error": str(exc)}, now)
            self.apply([replace(event, evidence=params_of(action))])

    def _capped(self, run: RunRecord, intent: int, action: Action, exc: CapReached) -> None:
        """The guard's cluster-wide cap refused a node change: the node stays excluded from the run,
        not drained, and the incident pages once (``mass_fault``, keyed per attempt as the domain's)."""
        self._fail(run, intent, action, exc)
        assert isinstance(action, ChangeNode)
        now = self.clock.now()
        self.capped_until, self._refused[action.node] = max(self.capped_until, exc.frees_at), now
        message = (
            f"mass fault: the node guard's cluster-wide cap is reached: {action.node} is excluded from the run "
            f"but not drained, for a human to judge ({exc})"
        )
        key = f"{run.name}:mass_fault:{run.attempt.seq if run.attempt else None}"
        evidence = {"faulted": {action.node: action.reason}, "drained": [], "excluded": [action.node]}
        self.apply([replace(run_event(run, EventKind.MASS_FAULT, message, key, now), evidence=evidence)])

    # ------------------------------------------------------------------ crash recovery

    def settle_open_intents(self, snap: ClusterSnapshot) -> tuple[set[str], bool]:
        """Complete intents a previous daemon left open. Returns the runs still waiting on one (this
        tick's snapshot predates the retried action: they decide next tick), and whether anything
        was performed."""
        blocked: set[str] = set()
        acted = False
        for intent in self.store.open_actions():
            run = self.store.get_run(intent.run)
            if run is None:
                continue
            action = action_from(intent.kind, intent.params)
            tag = intents.intent_tag(run.name, self.store.instance_id, intent.id, intent.params)
            outcome = effect_present(intent.kind, tag, intent.params, snap, self.own_uid) or goal_written(
                self.store, run.name, action
            )
            if outcome is not None:
                log.info("intent_settled", intent=intent.id, action=intent.kind, outcome=outcome)
                self._complete(run, intent.id, action, outcome)
                self.apply(intents.duplicate_warnings(run.name, intent.id, outcome, self.clock.now()))
                continue
            log.info("intent_retried", intent=intent.id, action=intent.kind)
            blocked.add(run.name)
            try:
                self._perform_and_complete(run, intent.id, action)
                acted = True
            except TransientError:
                pass
        return blocked, acted


def prequeued(run: RunRecord, action: Submit, job_id: int, now: float) -> list[Record]:
    """A pre-queued successor on record (records.Successor, written through the store), and its line."""
    a = run.attempt
    assert a is not None and action.after_job is not None
    message = f"pre-queued job {job_id} behind job {action.after_job}, held until its end is judged ({action.reason})"
    key = f"{run.name}:{a.seq}:prequeued:{job_id}"
    event = replace(run_event(run, EventKind.PREQUEUED, message, key, now), evidence={"job_id": job_id})
    return [SuccessorSet(run.name, Successor(job_id, a.seq, now, action.exclude)), event]


def _done_events(run: RunRecord, action: Action, now: float) -> list[Record]:
    """The logbook line an action other than a submission or a node change leaves once done."""
    a = run.attempt
    seq = a.seq if a else None
    if isinstance(action, Cancel) and run.state is RunState.RECOVERING:
        key = f"{run.name}:{seq}:stopped:{action.job_id}"
        return [run_event(run, EventKind.STOPPED, f"stopped job {action.job_id}: {action.reason}", key, now)]
    if isinstance(action, Release):
        key = f"{run.name}:{seq}:released:{now:.3f}"
        return [run_event(run, EventKind.RELEASED, f"released job {action.job_id}: {action.reason}", key, now)]
    if isinstance(action, Fence):
        key = f"{run.name}:{seq}:fenced:{action.node}"
        return [run_event(run, EventKind.FENCED, f"fenced {action.node} (site fence command)", key, now)]
    return []


def run_event(run: RunRecord, kind: EventKind, message: str, key: str, now: float) -> Event:
    """A logbook line about the run's current attempt (the engine's own lines, outside decisions)."""
    a = run.attempt
    return Event(
        run=run.name,
        kind=kind,
        message=message,
        key=key,
        at=now,
        attempt=a.seq if a else None,
        job_id=a.job_id if a else None,
    )


def _loggable(params: Mapping[str, Any]) -> dict[str, Any]:
    return {f"p_{k}": v for k, v in params.items() if k != "run"}
