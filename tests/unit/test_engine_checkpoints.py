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
from unit.sim_world import SimWorld

from supervisor.domain.checkpoints.manifest import Level
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.records import EventKind
from supervisor.domain.run import CheckpointPolicy, RunSpec, SparePolicy
from supervisor.testing.kit.specs import spec

POLICY = CheckpointPolicy(
    root=ROOT,
    scan_interval_s=10.0,
    expected_interval_s=600.0,
    alarm_intervals=3.0,
    resume_file="/shared/llm/resume.json",
)
SPEC = spec(spare_policy=SparePolicy.NAMED, spare_nodes=("n004",), max_restarts=5, checkpoints=POLICY)


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
    intent = [i for i in w.store.open_actions() if i.kind == "submit"][0]
    assert intent.params["resume"]["checkpoint"]["step"] == 100
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


# ---------------------------------------------------------------- fallback only on evidence of a failed load


def _storm_world(tmp_path, steps=(100, 200, 300, 400, 500)) -> SimWorld:
    spec = replace(SPEC, output="/logs/%x-%j.out", max_restarts=30)
    w = SimWorld(
        tmp_path, spec, watch_checkpoints=True, hang=HangSettings(floor_s=1800, cap_s=7200, startup_grace_s=7200)
    )
    w.until(w.running)
    for step in steps:
        w.ckpt.save(step)
    w.ticks(12)
    return w


def _die(w: SimWorld, seq: int, lines: tuple[str, ...], after_s: float, *, restart_daemon: bool = False) -> str:
    """The current attempt writes ``lines`` to its log, dies ``after_s`` after starting, and the next
    attempt runs (restarts may be paced: virtual time passes); the step the dead attempt was handed."""
    job = w.run().attempt.job_id
    handed = w.submitted_env()["SSV_RESUME_STEP"]
    w.until(lambda: f"/logs/llm-{job}.out" in w.logs, limit=5)
    for line in lines:
        w.logs[f"/logs/llm-{job}.out"].append(line)
    w.ticks(2)
    w.clock.wait(after_s - (w.clock.now() - w.run().attempt.started_at))
    w.ticks(1)
    w.cluster.finish_job(job, exit_code=1)
    if restart_daemon:
        w.new_engine()
    w.until(lambda: w.running(seq + 1), limit=400, interval=15.0)
    return handed


def _passed_over(w: SimWorld) -> list:
    return [e for e in w.events(EventKind.WARNING) if " passed over: " in e.message]


UNRELATED = (  # a bad module load and a broken data mount: nothing to do with the checkpoint
    "/var/spool/slurmd/job00042/slurm_script: line 12: module: command not found",
    "Lmod has detected the following error: Unable to load module because of error: cuda/12.4",
    "FileNotFoundError: [Errno 2] No such file or directory: '/lustre/data/tokens_text_document.bin'",
)
SILENT = UNRELATED[:2]  # the shell's complaints only: nothing says when or why the trainer stopped


def test_attempts_dying_at_start_for_another_reason_fall_back_one_checkpoint_at_most(tmp_path):
    """Every attempt dies 20 s after starting, its log saying nothing of why (issue 21: the old rule
    walked back from 500 to 100, two attempts a checkpoint). Without evidence that loading failed
    the run falls back once (500 -> 400), then keeps 400 and says why."""
    w = _storm_world(tmp_path)
    handed = [_die(w, seq, SILENT, 20.0) for seq in range(11)]  # attempt 0 started from scratch
    assert handed[:3] == ["", "500", "500"] and set(handed[3:]) == {"400"}
    assert w.submitted_env()["SSV_RESUME_STEP"] == "400"
    passed = _passed_over(w)
    assert len(passed) == 1 and "step_000500" in passed[0].message
    assert "no evidence that loading it failed" in passed[0].message
    kept = [e for e in w.events(EventKind.WARNING) if "kept:" in e.message]
    assert len(kept) == 1 and "step_000400" in kept[0].message and "does not fall back further" in kept[0].message


def test_attempts_whose_log_shows_an_error_before_any_load_never_walk_back(tmp_path):
    """The same crash loop, but each log ends with the exception the trainer died of before it
    loaded anything (bench/storms.py (b)): the checkpoint is not to blame, and none is passed
    over — not even the one step back allowed without evidence."""
    w = _storm_world(tmp_path)
    handed = [_die(w, seq, UNRELATED, 20.0) for seq in range(7)]
    assert handed[0] == "" and set(handed[1:]) == {"500"}
    assert _passed_over(w) == []
    a = w.store.attempts("llm")[-2]  # the newest that died (the last one runs)
    assert a.failed_before_load is not None and "FileNotFoundError" in a.failed_before_load


MEGATRON_LOAD_ERROR = (
    " loading checkpoint from /ckpt/llm at iteration {step}",
    "Traceback (most recent call last):",
    "RuntimeError: Error(s) in loading state_dict for GPTModel:",
    "\tsize mismatch for embedding.word_embeddings.weight: copying a param with shape torch.Size([50304, 4096])",
)


@pytest.mark.parametrize("restart_daemon", [False, True])
def test_a_checkpoint_that_fails_to_load_is_passed_over_with_the_error_as_why(tmp_path, restart_daemon):
    """Each attempt logs a load error after a long load (30 min: past the "soon after starting"
    window the old rule required, so it never passed these over): the checkpoint is passed over,
    then the next one too (evidence allows more than one step back), the error named as why —
    whether or not the daemon restarted in between (the evidence is in the store)."""
    w = _storm_world(tmp_path)
    handed = [_die(w, 0, (), 20.0)]  # attempt 0 started from scratch
    for seq in range(1, 5):
        step = w.submitted_env()["SSV_RESUME_STEP"]
        lines = tuple(line.format(step=step) for line in MEGATRON_LOAD_ERROR)
        handed.append(_die(w, seq, lines, 1800.0, restart_daemon=restart_daemon))
    assert handed == ["", "500", "500", "400", "400"]
    assert w.submitted_env()["SSV_RESUME_STEP"] == "300"
    passed = _passed_over(w)
    assert [("step_000500" in e.message, "step_000400" in e.message) for e in passed] == [(True, False), (False, True)]
    for e in passed:
        assert "loading it failed" in e.message and "Error(s) in loading state_dict" in e.message
        assert "Error(s) in loading state_dict" in e.evidence["load_failed"]


def test_a_load_that_began_and_never_reached_a_step_is_evidence(tmp_path):
    """The attempts say a load began (JSONL event) and die before any step or a finished load:
    evidence enough to fall back more than one checkpoint."""
    w = _storm_world(tmp_path)
    start = ('{"ssv": 1, "event": "checkpoint_load_start"}',)
    handed = [_die(w, seq, start if seq else (), 20.0) for seq in range(5)]
    assert handed == ["", "500", "500", "400", "400"]
    assert w.submitted_env()["SSV_RESUME_STEP"] == "300"
    passed = _passed_over(w)
    assert len(passed) == 2 and all("logged no step and no finished load" in e.message for e in passed)


def test_a_load_that_finished_is_no_evidence(tmp_path):
    """The load began and finished (Megatron's "successfully loaded"); the attempts then die of
    something else before their first step: no evidence, one step back at most."""
    w = _storm_world(tmp_path)
    _die(w, 0, (), 20.0)  # attempt 0 started from scratch
    for seq in range(1, 7):
        step = w.submitted_env()["SSV_RESUME_STEP"]
        lines = (
            f" loading checkpoint from /ckpt/llm at iteration {step}",
            f" successfully loaded checkpoint from /ckpt/llm [ t 0, p 0 ] at iteration {step}",
            "FileNotFoundError: [Errno 2] No such file or directory: '/lustre/data/tokens_text_document.bin'",
        )
        _die(w, seq, lines, 20.0)
    assert w.submitted_env()["SSV_RESUME_STEP"] == "400"
    assert len(_passed_over(w)) == 1


def test_the_job_is_handed_the_runs_manifest_key_and_a_run_without_checkpoints_none(tmp_path) -> None:
    """Issue 32, finding 7: the trainer's commit signs with the key the daemon checks manifests with."""
    from supervisor.domain.checkpoints.signing import KEY_ENV, manifest_key

    plain = replace(SPEC, name="plain", checkpoints=None)
    w = SimWorld(tmp_path, SPEC, plain, nodes=8)
    w.tick()
    envs = {env["SLURM_SUPERVISOR_RUN"]: env for env in (w.submitted_env(0), w.submitted_env(1))}
    assert envs[SPEC.name][KEY_ENV] == manifest_key(w.store.run_token(SPEC.name)).hex()
    assert KEY_ENV not in envs["plain"]
