"""Checkpoints in the engine, on the simulated cluster and virtual time: new checkpoints are
verified and logged, a restart is handed the newest verified one (never a torn or corrupt one),
the choice survives a daemon crash, and the staleness alarm fires.

The checkpoint store here is the real one over storage held in memory
(tests/memory_checkpoints.py; the memory, POSIX and S3 storages run one contract in tests/checkpoints/)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from memory_checkpoints import ROOT
from sim_world import SimWorld

from supervisor.domain.checkpoints import Level
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.records import EventKind
from supervisor.domain.run import CheckpointPolicy, RunSpec, SparePolicy

POLICY = CheckpointPolicy(
    root=ROOT,
    scan_interval_s=10.0,
    expected_interval_s=600.0,
    alarm_intervals=3.0,
    resume_file="/shared/llm/resume.json",
)
SPEC = RunSpec(
    name="llm",
    script="/train.sbatch",
    partition="main",
    nodes=2,
    spare_policy=SparePolicy.NAMED,
    spare_nodes=("n004",),
    max_restarts=5,
    checkpoints=POLICY,
)


def world(tmp_path, spec: RunSpec = SPEC) -> SimWorld:
    return SimWorld(tmp_path, spec, watch_checkpoints=True)


def test_first_submission_without_checkpoints_says_start_from_scratch(tmp_path):
    w = world(tmp_path)
    w.until(w.running)
    env = w.submitted_env(0)
    assert env["SSV_RESUME_CHECKPOINT"] == "" and env["SSV_RESUME_STEP"] == ""
    assert env["SSV_RESUME_FILE"] == "/shared/llm/resume.json"
    plan = json.loads(w.files["/shared/llm/resume.json"])
    assert plan["checkpoint"] is None and plan["run"] == "llm"


def test_new_checkpoints_are_verified_at_both_levels_and_logged(tmp_path):
    w = world(tmp_path)
    w.until(w.running)
    w.ckpt.save(100)
    w.ckpt.save(200).flip_bit(1)  # crc64nvme differs: a bit flip at rest
    w.until(lambda: len(w.events(EventKind.CHECKPOINT_CORRUPT)) == 1, limit=30)
    assert ("step_000100", Level.METADATA) in w.ckpt.verified and ("step_000100", Level.FULL) in w.ckpt.verified
    verified = w.events(EventKind.CHECKPOINT_VERIFIED)
    assert {(e.evidence["step"], e.evidence["level"]) for e in verified} == {
        (100, "metadata"),
        (100, "full"),
        (200, "metadata"),
    }
    corrupt = w.events(EventKind.CHECKPOINT_CORRUPT)[0]
    assert corrupt.evidence["step"] == 200 and corrupt.evidence["problems"][0]["key"] == "shard-1"
    # each checkpoint is verified once per level, not at every scan
    w.ticks(40)
    assert w.ckpt.verified.count(("step_000100", Level.FULL)) == 1


def test_restart_after_a_node_death_resumes_from_the_newest_verified_not_the_torn_one(tmp_path):
    w = world(tmp_path)
    w.until(w.running)
    w.ckpt.save(100)
    w.ckpt.save(200)
    w.ticks(15)
    w.ckpt.save(300, committed=False)  # the node dies while checkpoint 300 is half uploaded
    w.cluster.crash_node(w.run().attempt.nodes[0])
    w.until(lambda: w.running(1))
    env = w.submitted_env()
    assert env["SSV_RESUME_STEP"] == "200" and env["SSV_RESUME_CHECKPOINT"] == ROOT + "step_000200/"
    assert env["SSV_RESUME_GUARANTEE"] == "manifest"
    plan = json.loads(w.files["/shared/llm/resume.json"])
    assert [f["step"] for f in plan["fallbacks"]] == [100]
    assert plan["skipped"][0]["step"] == 300 and "commit marker" in plan["skipped"][0]["why"]
    restarted = w.events(EventKind.RESTARTED)[0]
    assert "resuming from step 200" in restarted.message and "step 300 skipped" in restarted.message
    assert restarted.evidence["resume_step"] == 200


def test_a_checkpoint_not_yet_scanned_is_verified_at_restart_and_a_corrupt_one_is_passed_over(tmp_path):
    w = world(tmp_path, replace(SPEC, checkpoints=replace(POLICY, scan_interval_s=3600.0)))
    w.until(w.running)
    w.ckpt.save(100)
    w.ckpt.save(200).remove_shard(0)
    w.cluster.crash_node(w.run().attempt.nodes[0])  # before any scan has seen either checkpoint
    w.until(lambda: w.running(1))
    assert w.submitted_env()["SSV_RESUME_STEP"] == "100"
    skipped = json.loads(w.files["/shared/llm/resume.json"])["skipped"]
    assert skipped[0]["step"] == 200 and "corrupt" in skipped[0]["why"]


def test_storage_trouble_never_marks_a_checkpoint_corrupt_and_is_retried(tmp_path):
    w = world(tmp_path)
    w.until(w.running)
    ck = w.ckpt.save(100)
    ck.storage_down = True
    w.until(lambda: w.events(EventKind.CHECKPOINT_UNVERIFIABLE), limit=30)
    assert not w.events(EventKind.CHECKPOINT_CORRUPT)
    ck.storage_down = False
    w.until(lambda: w.events(EventKind.CHECKPOINT_VERIFIED), limit=30)
    w.ckpt.listing_down = True  # a listing outage neither crashes the tick nor forgets what was verified
    w.cluster.crash_node(w.run().attempt.nodes[0])
    w.until(lambda: w.running(1))
    assert w.submitted_env()["SSV_RESUME_STEP"] == "100"
    listing = [e for e in w.events(EventKind.WARNING) if "cannot list the checkpoint root" in e.message]
    assert len(listing) == 1 and "listing timed out" in listing[0].message  # once, however many scans fail


def test_the_resume_choice_is_journaled_so_a_crash_before_submitting_hands_the_same_checkpoint(tmp_path):
    w = world(tmp_path)
    w.until(w.running)
    w.ckpt.save(100)
    w.ticks(12)

    class Crash(BaseException):
        pass

    def crash(boundary: str, kind: str) -> None:
        if boundary == "after_intent" and kind == "submit":
            raise Crash()

    w.crash_hook = crash  # the daemon dies between journaling the submission and submitting
    w.cluster.crash_node(w.run().attempt.nodes[0])
    try:
        w.ticks(30)
    except Crash:
        pass
    else:
        raise AssertionError("the injected crash did not happen")
    intent = [a for a in w.store.open_actions() if a["kind"] == "submit"][0]
    assert intent["params"]["resume"]["checkpoint"]["step"] == 100
    w.ckpt.save(200)  # appears while the daemon is down: the retried intent still hands step 100
    w.crash_hook = None
    w.new_engine()
    w.until(lambda: w.running(1))
    assert w.submitted_env()["SSV_RESUME_STEP"] == "100"


def test_no_verified_checkpoint_for_k_intervals_raises_one_alarm(tmp_path):
    w = world(tmp_path)
    w.until(w.running)
    w.clock.wait(3 * 600.0 + 5)
    w.ticks(5)
    stale = w.events(EventKind.CHECKPOINT_STALE)
    assert len(stale) == 1 and "newest verified: none yet" in stale[0].message
    w.ckpt.save(100)
    w.ticks(15)
    assert len(w.events(EventKind.CHECKPOINT_STALE)) == 1  # a fresh verified checkpoint resets it


def test_a_checkpoint_the_job_keeps_failing_on_is_passed_over_for_the_next_older_one(tmp_path):
    w = world(tmp_path)
    w.until(w.running)
    w.ckpt.save(100)
    w.ckpt.save(200)  # verifies fine, but the trainer cannot load it (say, a sharding mismatch)
    w.ticks(12)
    for seq in (0, 1):
        w.cluster.finish_job(w.run().attempt.job_id, exit_code=1)
        w.until(lambda seq=seq: w.running(seq + 1))
        assert w.submitted_env()["SSV_RESUME_STEP"] == "200"
        w.ticks(5)
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=1)  # the second failure in a row on step 200
    w.until(lambda: w.running(3))
    assert w.submitted_env()["SSV_RESUME_STEP"] == "100"
    warning = [e for e in w.events(EventKind.WARNING) if "passed over" in e.message]
    assert len(warning) == 1 and "step_000200" in warning[0].message


def _megatron(step: int) -> str:
    return (
        f" iteration {step:8d}/ 1000000 | consumed samples: {step * 64} | elapsed time per iteration (ms): "
        "1000.0 | learning rate: 1.0E-04 | global batch size: 64 | lm loss: 2.5 | loss scale: 1.0 | "
        "grad norm: 1.0 | number of skipped iterations: 0 | number of nan iterations: 0 |"
    )


def _fallback_world(tmp_path) -> SimWorld:
    spec = replace(SPEC, output="/logs/%x-%j.out", max_restarts=10)
    w = SimWorld(
        tmp_path, spec, watch_checkpoints=True, hang=HangSettings(floor_s=1800, cap_s=3600, startup_grace_s=3600)
    )
    w.until(w.running)
    w.ckpt.save(100)
    w.ckpt.save(200)
    w.ticks(12)
    return w


def _fail(w: SimWorld, seq: int, *, logged_step: int | None, restart_daemon: bool) -> None:
    """The current attempt logs ``logged_step`` (if any), dies soon after starting, and the next
    attempt runs; with ``restart_daemon`` a new daemon (no memory) takes over in between."""
    job = w.run().attempt.job_id
    if logged_step is not None:
        w.until(lambda: f"/logs/llm-{job}.out" in w.logs, limit=5)
        w.logs[f"/logs/llm-{job}.out"].append(_megatron(logged_step))
        w.ticks(2)
    w.cluster.finish_job(job, exit_code=1)
    if restart_daemon:
        w.new_engine()
    w.until(lambda: w.running(seq + 1))


@pytest.mark.parametrize("restart_daemon", [False, True])
def test_a_daemon_restart_mid_fallback_makes_the_same_choice(tmp_path, restart_daemon):
    """Two attempts in a row that die on checkpoint 200 without training past it: it is passed over
    — whether or not the daemon restarted between them (what it decides on is in the store)."""
    w = _fallback_world(tmp_path)
    for seq in (0, 1, 2):
        _fail(w, seq, logged_step=None, restart_daemon=restart_daemon)
    assert w.submitted_env()["SSV_RESUME_STEP"] == "100"


@pytest.mark.parametrize("restart_daemon", [False, True])
def test_attempts_that_trained_past_their_checkpoint_never_pass_it_over(tmp_path, restart_daemon):
    """Each attempt logged a step past checkpoint 200 before dying: 200 loaded, something else
    killed them. The last step each logged is in the store, so a new daemon knows it too (it used
    to be kept in memory only, and a restart demoted a good checkpoint)."""
    w = _fallback_world(tmp_path)
    for seq in (0, 1, 2):
        _fail(w, seq, logged_step=250 + seq, restart_daemon=restart_daemon)
        assert w.submitted_env()["SSV_RESUME_STEP"] == "200"
    assert not [e for e in w.events(EventKind.WARNING) if "passed over" in e.message]


def test_an_unwritable_resume_file_is_a_warning_and_the_job_still_gets_its_checkpoint(tmp_path):
    w = world(tmp_path)

    def refuse(path: str, text: str) -> None:
        raise PermissionError(13, "Read-only file system", path)

    w.write_resume = refuse
    w.ckpt.save(100)
    w.until(w.running)
    env = w.submitted_env(0)
    assert env["SSV_RESUME_STEP"] == "100" and "SSV_RESUME_FILE" not in env
    warning = [e for e in w.events(EventKind.WARNING) if "resume file" in e.message]
    assert len(warning) == 1 and "ReadWritePaths" in warning[0].message
