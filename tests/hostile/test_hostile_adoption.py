"""After an sbatch that timed out (or a daemon crash), the open submit intent is settled against
Slurm: only a job of the daemon's own user carrying the submission's tag, random nonce included,
is taken for the one it submitted; two such jobs are a loud warning, never a silent min()
(issue 17, item 5; review finding #10). Each attack here failed on the old code."""

from __future__ import annotations

import os
from dataclasses import replace

import structlog

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState, SubmitRequest
from supervisor.domain.observation import REASON_PREFIX
from supervisor.domain.records import EventKind
from supervisor.ports import TransientError
from supervisor.sim.clock import VirtualClock
from supervisor.sim.slurm.cluster import SimCluster
from supervisor.testing.kit.engine import EngineHarness
from supervisor.testing.kit.specs import spec

SPEC = spec(name="llama", max_restarts=5)
MALLORY = 4242 if os.getuid() != 4242 else 4243


class TimedOutSubmit:
    """The simulated cluster, except that the first sbatch times out without a job (as an
    overloaded controller can), while ``plant`` puts jobs of its choosing into every snapshot."""

    def __init__(self, cluster: SimCluster, plant) -> None:
        self.cluster, self.plant = cluster, plant
        self.planted: list[JobInfo] = []
        self.store = None

    def __getattr__(self, name):
        return getattr(self.cluster, name)

    def submit(self, request: SubmitRequest) -> int:
        if self.store is not None:
            intent = self.store.open_actions()[-1].id
            self.planted, self.store = self.plant(request, intent), None
            raise TransientError("sbatch timed out after 20 s")
        return self.cluster.submit(request)

    def snapshot(self, include_nodes: bool = True) -> ClusterSnapshot:
        snap = self.cluster.snapshot(include_nodes)
        return replace(snap, jobs={**snap.jobs, **{j.job_id: j for j in self.planted}})


def world(tmp_path, plant) -> tuple[EngineHarness, TimedOutSubmit]:
    clock = VirtualClock()
    sched = TimedOutSubmit(SimCluster(clock, 4, "main"), plant)
    w = EngineHarness(tmp_path, clock=clock, scheduler=sched, open_store=SqliteStore, specs=[SPEC])
    sched.store = w.store
    return w, sched


def job(job_id: int, comment: str, user_id: int | None) -> JobInfo:
    return JobInfo(job_id, SPEC.name, JobState.PENDING, comment=comment, partition="main", user_id=user_id)


def followed(w: EngineHarness) -> int:
    attempt = w.run().attempt
    assert attempt is not None
    return attempt.job_id


def test_another_users_job_with_the_exact_tag_is_not_adopted(tmp_path):
    w, sched = world(tmp_path, lambda request, intent: [job(990001, request.comment, MALLORY)])
    with structlog.testing.capture_logs() as logs:
        w.until(lambda: w.run().attempt is not None, limit=20)
    assert followed(w) != 990001, "the run follows another user's job"
    assert any(e["log_level"] == "error" and 990001 in e.get("jobs", ()) for e in logs), logs


def test_a_job_with_the_guessable_tag_of_the_old_format_is_not_adopted(tmp_path):
    """Instance id and intent id can be read off earlier jobs' comments; the nonce cannot."""

    def guess(request, intent):
        return [job(990002, f"{REASON_PREFIX}:{SPEC.name}:{w.store.instance_id}:{intent}", os.getuid())]

    w, sched = world(tmp_path, guess)
    w.until(lambda: w.run().attempt is not None, limit=20)
    assert followed(w) != 990002, "the run follows a job whose tag was guessed"


def test_two_own_jobs_with_the_tag_are_a_loud_warning(tmp_path):
    def plant(request, intent):
        return [job(990003, request.comment, os.getuid()), job(990004, request.comment, os.getuid())]

    w, sched = world(tmp_path, plant)
    with structlog.testing.capture_logs() as logs:
        w.until(lambda: w.run().attempt is not None, limit=20)
    assert followed(w) in (990003, 990004)
    warnings = [e for e in w.events(EventKind.WARNING) if "990003" in e.message and "990004" in e.message]
    assert warnings, [e.message for e in w.events()]
    assert any(e["log_level"] == "error" and e["event"] == "intent_duplicate_jobs" for e in logs), logs


def test_the_nonce_is_journaled_with_the_intent_and_differs_per_submission(tmp_path):
    comments: list[str] = []

    def record(request, intent):
        comments.append(request.comment)
        return []

    w, sched = world(tmp_path, record)
    w.until(lambda: w.run().attempt is not None, limit=20)
    retried = w.view().jobs[followed(w)].comment
    assert retried == comments[0], "a retried submission carries the journaled tag"
    assert len(comments[0].rsplit(":", 1)[-1]) >= 16  # 64 random bits at least
