"""Issue 31, item 2: no gap in the queue. With ``[continuation] prequeue_s`` the next job is
submitted held, behind ``--dependency=afterany``, before the current one's limit; released as the
next attempt when the planned end is continued, from the checkpoint saved *at* the end (the resume
file rewritten before the release); cancelled and replaced by one that keeps the bad node out after
a fault in the last window; exactly one successor when the daemon dies at any action boundary.

The engine on the simulated cluster and virtual time (tests/unit/test_continuation.py's world)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from unit.test_continuation import SPEC, kinds, train, world

from supervisor.domain.goodput.account import goodput
from supervisor.domain.records import EventKind
from supervisor.domain.run import CheckpointPolicy, ContinuationPolicy

LIMIT_S, LEAD_S = 3600, 600
CHAIN = replace(
    SPEC,
    checkpoints=replace(SPEC.checkpoints, resume_file="/shared/llm/resume.json"),
    continuation=ContinuationPolicy(prequeue_s=LEAD_S, time_limit_s=LIMIT_S),
)
assert isinstance(CHAIN.checkpoints, CheckpointPolicy)


class SimulatedCrash(BaseException):
    """The daemon dying at an action boundary (nothing may catch it)."""


def submits(w) -> int:
    return w.cluster.count_calls("submit")


def to_prequeue(w, first: int = 1, last: int = 200) -> None:
    """The attempt trains past the pre-queue time: its successor is queued, held."""
    train(w, first, last)
    start = w.run().attempt.started_at
    w.until(lambda: w.clock.now() >= start + LIMIT_S - LEAD_S + 5, limit=2000, interval=5.0)
    w.ticks(2)


def test_the_successor_is_queued_before_the_limit_and_released_at_the_end(tmp_path):
    w = world(tmp_path, CHAIN)
    to_prequeue(w)
    assert submits(w) == 2 and w.run().attempt.seq == 0  # today: the next job only after the end
    successor = w.run().successor
    request = w.cluster.job_request(successor.job_id)
    assert "--hold" in request.extra_args and f"--dependency=afterany:{w.run().attempt.job_id}" in request.extra_args
    assert "SSV_RESUME_CHECKPOINT" not in request.env and request.env["SSV_RESUME_FROM_FILE"] == "1"
    w.ticks(20, interval=5.0)
    assert w.job().state.value == "RUNNING" and w.view().jobs[successor.job_id].state.value == "PENDING"
    w.ckpt.save(200)  # the save at the signal, after the successor was queued
    w.cluster.time_out(w.run().attempt.job_id)
    w.until(lambda: w.running(seq=1))
    run = w.run()
    assert run.attempt.job_id == successor.job_id and submits(w) == 2 and run.successor is None
    assert run.restarts_spent == 0 and "fault" not in kinds(w)
    assert json.loads(w.files["/shared/llm/resume.json"])["checkpoint"]["step"] == 200  # as of its start
    assert w.run_overlaps() == []
    report = goodput("llm", w.store.attempts("llm"), w.store.events("llm"), now=w.clock.now())
    assert report.interruptions == ()


def test_a_fault_in_the_last_window_replaces_the_successor_with_one_that_keeps_the_node_out(tmp_path):
    w = world(tmp_path, CHAIN)
    to_prequeue(w)
    successor = w.run().successor.job_id
    bad = w.run().attempt.nodes[0]
    w.cluster.crash_node(bad)
    w.until(lambda: w.running(seq=1), limit=600, interval=5.0)
    run = w.run()
    assert w.view().jobs[successor].state.value == "CANCELLED"
    assert run.attempt.job_id != successor and bad not in run.attempt.nodes and bad in run.excluded
    assert w.run_overlaps() == [] and submits(w) == 3
    assert len(w.events(EventKind.FAULT)) == 1


BOUNDARIES = ["before_intent", "after_intent", "after_execute", "after_complete"]


@pytest.mark.parametrize("kind", ["submit", "start_successor"])
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_crash_at_every_action_boundary_leaves_exactly_one_successor(tmp_path, boundary, kind):
    w = world(tmp_path, CHAIN)
    train(w, 1, 200)
    fired = []

    def hook(at, action):
        if at == boundary and action == kind and not fired:
            fired.append((at, action))
            raise SimulatedCrash(at)

    w.crash_hook = hook
    start = w.run().attempt.started_at

    def chain() -> None:
        w.until(lambda: w.clock.now() >= start + LIMIT_S - LEAD_S + 5, limit=2000, interval=5.0)
        w.ticks(2)
        w.ckpt.save(200)
        if w.run().attempt.seq == 0 and w.job().state.value == "RUNNING":
            w.cluster.time_out(w.run().attempt.job_id)
        w.until(lambda: w.running(seq=1))

    try:
        chain()
    except SimulatedCrash:
        w.crash_hook = None
        w.new_engine()  # the daemon starts again on the same state directory
        w.engine.adopt()
        chain()
    w.ticks(5)
    assert fired == [(boundary, kind)]
    assert submits(w) == 2  # the first job and exactly one successor
    assert w.run().restarts_spent == 0 and "fault" not in kinds(w)
    assert w.store.open_actions() == [] and w.run().successor is None
    assert w.run_overlaps() == []
