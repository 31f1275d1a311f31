"""The executor's half that writes typed records to the store: one handler per record type.

Called only by ``Executor.apply`` (engine.act.execute), inside its transaction: the executor stays the
one writer; this module holds the table of what each record becomes in the store (split from
execute to keep both small).
"""

from __future__ import annotations

import structlog

from supervisor.domain.actions import (
    ActiveFindings,
    AttemptContinued,
    AttemptEnded,
    AttemptLoadFailed,
    AttemptPreempted,
    AttemptProgress,
    AttemptRequeued,
    AttemptStarted,
    CheckpointChecked,
    CheckpointDemoted,
    CheckpointSeen,
    Defer,
    Exclude,
    NodeMark,
    Record,
    SetState,
    SuccessorDropped,
    SuccessorSet,
    Unexclude,
)
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.records import Event, NodeVerdict
from supervisor.domain.run import transition
from supervisor.domain.spikes.rollback import RollbackRecord
from supervisor.ports import Store

log = structlog.get_logger("supervisor.engine")


def write_record(s: Store, rec: Record, now: float) -> None:
    if isinstance(rec, Event):
        if s.record_event(rec):
            log.info("logbook", kind=rec.kind.value, message=rec.message)
    elif isinstance(rec, SetState):
        _set_state(s, rec, now)
    elif isinstance(rec, AttemptStarted):
        s.attempt_started(rec.run, rec.seq, rec.nodes, rec.at)
    elif isinstance(rec, AttemptEnded):
        s.attempt_ended(rec.run, rec.seq, rec.at, rec.end_state, rec.reason, rec.exit_code)
    elif isinstance(rec, AttemptRequeued):
        s.add_attempt(rec.run, rec.job_id, rec.restart_count, rec.at, rec.excluded)
    elif isinstance(rec, AttemptProgress):
        s.attempt_progress(rec.run, rec.seq, rec.last_step, rec.step_time_s, rec.hang_pace, rec.save_s)
    elif isinstance(rec, AttemptLoadFailed):
        s.attempt_load_failed(rec.run, rec.seq, rec.why, before_load=rec.before_load)
    elif isinstance(rec, AttemptContinued):
        s.attempt_continued(rec.run, rec.seq, rec.checkpoint)
    elif isinstance(rec, AttemptPreempted):
        s.attempt_preempted(rec.run, rec.seq, rec.at)
    elif isinstance(rec, SuccessorSet):
        s.set_successor(rec.run, rec.successor)
    elif isinstance(rec, SuccessorDropped):
        s.drop_successor(rec.run, rec.job_id)
    else:
        _write_node_record(s, rec, now)


def _write_node_record(s: Store, rec: Record, now: float) -> None:
    if isinstance(rec, Exclude):
        s.exclude(rec.run, rec.node, rec.reason, now)
    elif isinstance(rec, Defer):
        s.defer(rec.run, rec.node, rec.reason, now)
    elif isinstance(rec, Unexclude):
        s.unexclude(rec.run, rec.node)
    elif isinstance(rec, NodeVerdict):
        s.set_verdict(rec)
    elif isinstance(rec, NodeMark):
        s.set_node_action(rec.node, rec.action, now)
    elif isinstance(rec, Fault):
        s.record_node_fault(rec)
    elif isinstance(rec, RollbackRecord):
        s.record_rollback(rec)
    elif isinstance(rec, ActiveFindings):
        s.keep_findings(rec.findings)
    else:
        _write_checkpoint_record(s, rec)


def _write_checkpoint_record(s: Store, rec: Record) -> None:
    if isinstance(rec, CheckpointSeen):
        s.checkpoint_seen(rec.run, rec.ref, rec.at)
    elif isinstance(rec, CheckpointChecked):
        s.checkpoint_result(rec.run, rec.result)
    elif isinstance(rec, CheckpointDemoted):
        s.demote_checkpoint(rec.run, rec.location, rec.why)
    else:  # pragma: no cover - a new record type without a handler is a programming error
        raise TypeError(f"no handler for record {rec!r}")


def _set_state(s: Store, rec: SetState, now: float) -> None:
    """The run state machine (domain.run's transition table) guards every change."""
    current = s.get_run(rec.run)
    if current is None or current.state is rec.state:
        return
    transition(rec.run, current.state, rec.state)
    s.set_state(rec.run, rec.state, now, rec.reason, rec.spend_restart)
