"""Checkpoints in the engine, on the simulated cluster and virtual time: new checkpoints are
verified and logged, a restart is handed the newest verified one (never a torn or corrupt one),
the choice survives a daemon crash, and the staleness alarm fires.

The checkpoint store here is a stateful in-memory fake of the CheckpointStore port (the real S3
and POSIX stores run the same contract in tests/checkpoints/)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from supervisor.adapters.sqlite_store import SqliteStore
from supervisor.domain.checkpoints import (
    CheckpointRef,
    Guarantee,
    Level,
    Manifest,
    Outcome,
    ShardProblem,
    VerifyResult,
)
from supervisor.domain.records import EventKind
from supervisor.domain.run import CheckpointPolicy, RunSpec, RunState, SparePolicy
from supervisor.engine.checkpoints import CheckpointWatch
from supervisor.engine.reconcile import Engine
from supervisor.ports import TransientError
from supervisor.sim.clock import VirtualClock
from supervisor.sim.cluster import SimCluster
from supervisor.sim.probe import SimProbe

ROOT = "mem://ckpt/"


@dataclass
class MemCheckpoint:
    step: int
    saved_at: float = 0.0
    committed: bool = True
    corrupt_meta: str | None = None  # found by a metadata check (missing shard, wrong size)
    corrupt_at_rest: str | None = None  # found only by reading every byte
    storage_down: bool = False


@dataclass
class MemCheckpointStore:
    """Checkpoints as plain records; verification reports what the injected damage would show."""

    clock: VirtualClock = field(default_factory=VirtualClock)
    root: str = ROOT
    items: dict[str, MemCheckpoint] = field(default_factory=dict)
    verified: list[tuple[str, Level]] = field(default_factory=list)
    listing_down: bool = False

    def save(self, step: int, **kw: object) -> MemCheckpoint:
        ck = self.items[f"step_{step:06d}"] = MemCheckpoint(step, self.clock.now(), **kw)  # type: ignore[arg-type]
        return ck

    def discover(self) -> list[CheckpointRef]:
        if self.listing_down:
            raise TransientError("listing timed out")
        return [
            CheckpointRef(self.root + name + "/", name, ck.step, Guarantee.MANIFEST, ck.committed, ck.saved_at)
            for name, ck in self.items.items()
        ]

    def verify(self, ref: CheckpointRef, level: Level) -> VerifyResult:
        self.verified.append((ref.name, level))
        ck = self.items[ref.name]

        def result(outcome: Outcome, reason: str, problems: tuple[ShardProblem, ...] = ()) -> VerifyResult:
            return VerifyResult(ref.location, ck.step, level, outcome, reason, problems=problems)

        if ck.storage_down:
            return result(Outcome.UNVERIFIABLE, "503 SlowDown after 5 attempts")
        if not ck.committed:
            return result(
                Outcome.CORRUPT,
                "no commit marker after the upload grace period",
                (ShardProblem("ssv-manifest.json", "uncommitted", "absent"),),
            )
        if ck.corrupt_meta:
            return result(Outcome.CORRUPT, ck.corrupt_meta, (ShardProblem("shard-0", "missing", ck.corrupt_meta),))
        if level is Level.FULL and ck.corrupt_at_rest:
            return result(
                Outcome.CORRUPT, ck.corrupt_at_rest, (ShardProblem("shard-1", "checksum", ck.corrupt_at_rest),)
            )
        return result(Outcome.VERIFIED, "checkpoint matches its manifest")

    def commit(self, name: str, manifest: Manifest) -> str:
        raise NotImplementedError("not used by the engine")


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


class World:
    def __init__(self, tmp_path, spec: RunSpec = SPEC) -> None:
        self.clock = VirtualClock()
        self.cluster = SimCluster(self.clock, 4, "main")
        self.ckpt = MemCheckpointStore(self.clock)
        self.files: dict[str, str] = {}
        self.dir = tmp_path
        SqliteStore(tmp_path).add_run(spec, self.clock.now())
        self.engine = self.new_engine()

    def new_engine(self) -> Engine:
        self.store = SqliteStore(self.dir)
        watch = CheckpointWatch(
            lambda spec: self.ckpt,
            self.clock,
            inline=True,
            write_resume=lambda path, text: self.files.__setitem__(path, text),
        )
        return Engine(
            scheduler=self.cluster, store=self.store, clock=self.clock, probe=SimProbe(self.cluster), checkpoints=watch
        )

    def until(self, predicate, limit: int = 300) -> None:
        for _ in range(limit):
            if predicate():
                return
            self.engine.tick()
            self.clock.wait(1.0)
        raise AssertionError("condition not reached")

    def idle(self, ticks: int) -> None:
        for _ in range(ticks):
            self.engine.tick()
            self.clock.wait(1.0)

    def run(self):
        return self.store.get_run("llm")

    def running(self, seq: int = 0) -> bool:
        r = self.run()
        return r.state is RunState.RUNNING and r.attempt.seq == seq and r.attempt.started_at is not None

    def submitted_env(self, n: int = -1) -> dict[str, str]:
        submits = [args[0] for name, *args in self.cluster.calls if name == "submit"]
        return dict(submits[n].env)

    def events(self, kind: EventKind):
        return [e for e in self.store.events("llm") if e.kind is kind]


def test_first_submission_without_checkpoints_says_start_from_scratch(tmp_path):
    w = World(tmp_path)
    w.until(w.running)
    env = w.submitted_env(0)
    assert env["SSV_RESUME_CHECKPOINT"] == "" and env["SSV_RESUME_STEP"] == ""
    assert env["SSV_RESUME_FILE"] == "/shared/llm/resume.json"
    plan = json.loads(w.files["/shared/llm/resume.json"])
    assert plan["checkpoint"] is None and plan["run"] == "llm"


def test_new_checkpoints_are_verified_at_both_levels_and_logged(tmp_path):
    w = World(tmp_path)
    w.until(w.running)
    w.ckpt.save(100)
    w.ckpt.save(200, corrupt_at_rest="crc64nvme differs: bit flip at rest")
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
    w.idle(40)
    assert w.ckpt.verified.count(("step_000100", Level.FULL)) == 1


def test_restart_after_a_node_death_resumes_from_the_newest_verified_not_the_torn_one(tmp_path):
    w = World(tmp_path)
    w.until(w.running)
    w.ckpt.save(100)
    w.ckpt.save(200)
    w.idle(15)
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
    w = World(tmp_path, replace(SPEC, checkpoints=replace(POLICY, scan_interval_s=3600.0)))
    w.until(w.running)
    w.ckpt.save(100)
    w.ckpt.save(200, corrupt_meta="shard-0 missing")
    w.cluster.crash_node(w.run().attempt.nodes[0])  # before any scan has seen either checkpoint
    w.until(lambda: w.running(1))
    assert w.submitted_env()["SSV_RESUME_STEP"] == "100"
    skipped = json.loads(w.files["/shared/llm/resume.json"])["skipped"]
    assert skipped[0]["step"] == 200 and "corrupt" in skipped[0]["why"]


def test_storage_trouble_never_marks_a_checkpoint_corrupt_and_is_retried(tmp_path):
    w = World(tmp_path)
    w.until(w.running)
    ck = w.ckpt.save(100, storage_down=True)
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
    w = World(tmp_path)
    w.until(w.running)
    w.ckpt.save(100)
    w.idle(12)

    class Crash(BaseException):
        pass

    def crash(boundary: str, kind: str) -> None:
        if boundary == "after_intent" and kind == "submit":
            raise Crash()

    w.engine._crash = crash  # the daemon dies between journaling the submission and submitting
    w.cluster.crash_node(w.run().attempt.nodes[0])
    try:
        w.idle(30)
    except Crash:
        pass
    else:
        raise AssertionError("the injected crash did not happen")
    intent = [a for a in w.store.open_actions() if a["kind"] == "submit"][0]
    assert intent["params"]["resume"]["checkpoint"]["step"] == 100
    w.ckpt.save(200)  # appears while the daemon is down: the retried intent still hands step 100
    w.engine = w.new_engine()
    w.until(lambda: w.running(1))
    assert w.submitted_env()["SSV_RESUME_STEP"] == "100"


def test_no_verified_checkpoint_for_k_intervals_raises_one_alarm(tmp_path):
    w = World(tmp_path)
    w.until(w.running)
    w.clock.wait(3 * 600.0 + 5)
    w.idle(5)
    stale = w.events(EventKind.CHECKPOINT_STALE)
    assert len(stale) == 1 and "newest verified: none yet" in stale[0].message
    w.ckpt.save(100)
    w.idle(15)
    assert len(w.events(EventKind.CHECKPOINT_STALE)) == 1  # a fresh verified checkpoint resets it


def test_a_checkpoint_the_job_keeps_failing_on_is_passed_over_for_the_next_older_one(tmp_path):
    w = World(tmp_path)
    w.until(w.running)
    w.ckpt.save(100)
    w.ckpt.save(200)  # verifies fine, but the trainer cannot load it (say, a sharding mismatch)
    w.idle(12)
    for seq in (0, 1):
        w.cluster.finish_job(w.run().attempt.job_id, exit_code=1)
        w.until(lambda seq=seq: w.running(seq + 1))
        assert w.submitted_env()["SSV_RESUME_STEP"] == "200"
        w.idle(5)
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=1)  # the second failure in a row on step 200
    w.until(lambda: w.running(3))
    assert w.submitted_env()["SSV_RESUME_STEP"] == "100"
    warning = [e for e in w.events(EventKind.WARNING) if "passed over" in e.message]
    assert len(warning) == 1 and "step_000200" in warning[0].message


def test_an_unwritable_resume_file_is_a_warning_and_the_job_still_gets_its_checkpoint(tmp_path):
    w = World(tmp_path)

    def refuse(path: str, text: str) -> None:
        raise PermissionError(13, "Read-only file system", path)

    w.engine.checkpoints._write_resume = refuse
    w.ckpt.save(100)
    w.until(w.running)
    env = w.submitted_env(0)
    assert env["SSV_RESUME_STEP"] == "100" and "SSV_RESUME_FILE" not in env
    warning = [e for e in w.events(EventKind.WARNING) if "resume file" in e.message]
    assert len(warning) == 1 and "ReadWritePaths" in warning[0].message
