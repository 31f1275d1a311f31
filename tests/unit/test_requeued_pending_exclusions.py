"""A job Slurm requeued (restart mode "requeue") and that stays PENDING: its exclude list is set
once, not rewritten every tick, and the intent journal and the logbook stay put while it waits.

Engine-level, on the simulated Slurm (virtual time, no sleeps)."""

from __future__ import annotations

from dataclasses import replace

from test_engine_sim import SPEC as RESUBMITTING
from unit.sim_world import SimWorld

from supervisor.domain.cluster import JobState
from supervisor.domain.run import RestartMode

SPEC = replace(RESUBMITTING, restart_mode=RestartMode.REQUEUE)  # 2 nodes of n001-n004, spare n004


def _requeued_after_a_node_crash(w: SimWorld) -> int:
    w.until(w.running)
    job_id = w.run().attempt.job_id
    w.cluster.crash_node("n001")
    w.until(lambda: w.cluster.job_info(job_id).restart_count == 1)
    return job_id


def _journal_and_logbook(w: SimWorld) -> tuple[int, int]:
    return len(w.store.actions("llm")), len(w.events())


def test_a_requeued_job_held_pending_gets_its_exclusions_once(tmp_path):
    w = SimWorld(tmp_path, SPEC)
    job_id = _requeued_after_a_node_crash(w)
    w.cluster.hold(job_id)  # someone holds it: it stays PENDING as long as we look
    w.ticks(3)  # the requeue is recorded and the exclude list set
    assert w.cluster.job_info(job_id).excluded_nodes == ("n001", "n004")
    assert w.cluster.count_calls("set_excluded") == 1
    before = _journal_and_logbook(w)
    w.ticks(30)  # quiet ticks and node refreshes alike
    assert w.cluster.job_info(job_id).state is JobState.PENDING
    assert w.cluster.count_calls("set_excluded") == 1 and _journal_and_logbook(w) == before
    w.cluster.repair_node("n001")  # back in service: dropped from the list once
    w.ticks(30)
    assert w.cluster.job_info(job_id).excluded_nodes == ("n004",)
    assert w.cluster.count_calls("set_excluded") == 2
    assert [a["kind"] for a in w.store.actions("llm")].count("set_excluded") == 2
    assert all(a["status"] == "done" for a in w.store.actions("llm"))


def test_a_requeued_job_that_needs_the_spare_is_let_onto_it(tmp_path):
    """Placement kept a pending job's spare exclusions while the nodes it may use were too few
    without the spare: the requeued job waited on 'Resources' for good (a resubmission ran)."""
    w = SimWorld(tmp_path, replace(SPEC, nodes=3))  # n001-n003 run it, n004 is the named spare
    job_id = _requeued_after_a_node_crash(w)
    w.ticks(60)
    job = w.cluster.job_info(job_id)
    assert job.state is JobState.RUNNING and "n004" in job.nodes


def test_an_exclusion_intent_is_settled_only_by_the_list_it_asked_for():
    """A daemon killed after journaling a list that drops a returned node, before Slurm got it:
    the longer list still in Slurm holds the asked one, and was taken for the intent's effect."""
    from supervisor.domain.actions import ActionKind
    from supervisor.domain.cluster import ClusterSnapshot, JobInfo
    from supervisor.engine.act.intents import effect_present

    job = JobInfo(7, "llm", JobState.PENDING, excluded_nodes=("n001", "n004"))
    snap = ClusterSnapshot(0.0, {7: job}, {})
    asked = {"job_id": 7, "nodes": ["n004"]}
    assert effect_present(ActionKind.SET_EXCLUDED, "tag", asked, snap) is None
    settled = effect_present(ActionKind.SET_EXCLUDED, "tag", {"job_id": 7, "nodes": ["n004", "n001"]}, snap)
    assert settled == {"excluded": ["n001", "n004"]}
