"""Peer copies in memory as the daemon knows them (supervisor.domain.checkpoints.memory): the
trainer's two events read from its output — bounded and validated, never a progress record — the
relaunch plan that names the newest generation (never for a new job, never for a rollback), what
the job is told, and the restore read back for the logbook and for goodput."""

from __future__ import annotations

import json
import random

import pytest

from supervisor.domain.alloc_step import AllocationStep, StepGoal
from supervisor.domain.checkpoints.manifest import Guarantee
from supervisor.domain.checkpoints.memory import (
    NO_MEMORY,
    MemoryGeneration,
    MemoryRestore,
    describe_restore,
    memory_event,
    memory_for_relaunch,
)
from supervisor.domain.checkpoints.resume import CheckpointPick, ResumePlan, ResumePlanError, describe_plan, resume_env
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState
from supervisor.domain.progress.frameworks.ssv import parse_object
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.records import AttemptRecord, RunRecord
from supervisor.domain.run import RestartMode, RunState
from supervisor.engine.facts.observe import _memory_restores
from supervisor.engine.watch.progress import ProgressWatch
from supervisor.telemetry.orders import ResumeOrders
from supervisor.testing.kit.logs import MemoryLogs
from supervisor.testing.kit.specs import spec

SHA = "ab" * 32
KEPT = {"ssv": 1, "event": "memory_checkpoint", "generation": 45, "manifest": SHA}
RESTORED = {**KEPT, "event": "memory_restored", "offered_step": 40, "seconds": 0.023, "moved_bytes": 8192}


def test_the_two_events_are_read_from_an_output_line_with_a_prefix_in_front():
    assert memory_event(json.dumps(KEPT)) == MemoryGeneration(45, SHA)
    said = memory_event("[rank0]: " + json.dumps(RESTORED))
    assert said == MemoryRestore(MemoryGeneration(45, SHA), 40, 0.023, 8192)
    assert memory_event(json.dumps({**RESTORED, "seconds": "fast", "moved_bytes": -1})) == MemoryRestore(
        MemoryGeneration(45, SHA), 40, None, None
    )  # a field of the wrong kind is left out, the restore stays


@pytest.mark.parametrize(
    "line",
    [
        json.dumps({**KEPT, "generation": "45"}),
        json.dumps({**KEPT, "generation": True}),
        json.dumps({**KEPT, "generation": -5}),
        json.dumps({**KEPT, "generation": 0}),
        json.dumps({**KEPT, "generation": 1 << 60}),
        json.dumps({**KEPT, "manifest": "AB" * 32}),
        json.dumps({**KEPT, "manifest": SHA + "\n# forged"}),
        json.dumps({**KEPT, "ssv": True}),
        json.dumps({**KEPT, "ssv": 2}),
        json.dumps({**KEPT, "event": "memory_other"}),
        json.dumps({**KEPT, "pad": "x" * 2000}),
        '{"ssv": 1, "event": "memory_checkpoint", "generation": 45, "manifest": "' + SHA,  # torn
        "[" * 5000 + '"memory_',
    ],
)
def test_a_line_that_is_not_exactly_an_event_is_none(line):
    assert memory_event(line) is None


def test_garbage_never_raises():
    rng = random.Random(7)
    alphabet = '{}[]":,0123456789abcdef memory_checkpoint ssv generation manifest \\'
    for _ in range(2000):
        line = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
        assert memory_event(line) is None or isinstance(memory_event(line), MemoryGeneration | MemoryRestore)


def test_the_events_are_not_progress_records():
    """No ``step`` field: a generation reported late from the exchange's thread is not a step."""
    assert parse_object(json.dumps(KEPT)) is None and parse_object(json.dumps(RESTORED)) is None


def test_a_relaunch_is_told_the_newest_generation_only_when_newer_than_its_checkpoint_and_no_rollback():
    newest = MemoryGeneration(45, SHA)
    assert memory_for_relaunch(newest, 40, rollback=False) == newest
    assert memory_for_relaunch(newest, None, rollback=False) == newest  # no checkpoint: memory is all there is
    assert memory_for_relaunch(newest, 45, rollback=False) is NO_MEMORY
    assert memory_for_relaunch(newest, 60, rollback=False) is NO_MEMORY
    assert memory_for_relaunch(newest, 20, rollback=True) is NO_MEMORY  # it resumes before the copies' state
    assert memory_for_relaunch(None, 40, rollback=False) is NO_MEMORY


PLAN = ResumePlan(CheckpointPick("/ckpt/step_000040", 40, Guarantee.MANIFEST), reason="newest verified")


def test_the_plan_names_the_generation_in_its_json_its_environment_and_the_logbook():
    plan = ResumePlan(**{**PLAN.__dict__, "memory": MemoryGeneration(45, SHA)})
    assert ResumePlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert resume_env(plan)["SSV_RESUME_MEMORY_STEP"] == "45"
    assert "peer copies in memory hold step 45 (manifest abababababab)" in describe_plan(plan)
    told_none = ResumePlan(**{**PLAN.__dict__, "memory": NO_MEMORY})
    assert resume_env(told_none)["SSV_RESUME_MEMORY_STEP"] == "" and "memory" not in describe_plan(told_none)
    assert "SSV_RESUME_MEMORY_STEP" not in resume_env(PLAN) and "memory" not in PLAN.to_json()  # a new job


def test_a_journaled_plan_with_a_forged_generation_does_not_read_back():
    doc = {**PLAN.to_json(), "memory": {"step": 45, "manifest": "../../etc"}}
    with pytest.raises(ResumePlanError, match="memory"):
        ResumePlan.from_json(doc)


def test_the_trainer_reads_what_it_is_told_of_memory():
    assert ResumeOrders.from_env({}).memory_step is None  # not said: its own choice
    assert ResumeOrders.from_env({"SSV_RESUME_MEMORY_STEP": "45"}).memory_step == 45
    assert ResumeOrders.from_env({"SSV_RESUME_MEMORY_STEP": ""}).memory_step == 0  # not from memory
    assert ResumeOrders.from_env({"SSV_RESUME_MEMORY_STEP": "4e5"}).memory_step == 0


SPEC = spec(script="/w/t.sh", nodes=2, workdir="/w", output="/logs/%x-%j.out",
            restart_mode=RestartMode.IN_ALLOCATION, hot_spares=1)  # fmt: skip
A0 = AttemptRecord("llm", 0, 7, 0, 10.0, nodes=("n1", "n2", "n3"), started_at=20.0)
JOB = JobInfo(7, "llm", JobState.RUNNING, nodes=("n1", "n2", "n3"), start_time=20.0, stdout="/logs/llm-7.out")


def test_the_watch_keeps_the_newest_generation_and_hands_each_restore_over_once_as_a_logbook_note():
    logs = MemoryLogs()
    watch = ProgressWatch(logs, HangSettings())
    goal = StepGoal(7, 1, ("n1", "n3"), "n2 died", 60.0)
    record = RunRecord(spec=SPEC, state=RunState.RUNNING, attempt=A0, step=AllocationStep(goal))
    watch.update([record], ClusterSnapshot(30.0, {7: JOB}), 30.0)
    reported = [json.dumps({**KEPT, "generation": g}) for g in (40, 45, 35)]
    logs["/logs/llm-7.out"].append(*reported, json.dumps(RESTORED))
    watch.update([record], ClusterSnapshot(31.0, {7: JOB}), 31.0)
    assert watch.memory(7, 0) == MemoryGeneration(45, SHA)  # a late report of an older one changes nothing
    (note,) = _memory_restores([record], watch, 31.0)
    assert watch.take_restores() == []
    assert "restored step 45 from peer copies in memory (generation 45" in note.message
    assert "instead of the checkpoint at step 40" in note.message and "5 steps of work kept" in note.message
    assert note.evidence["in_allocation"] == "memory_restored" and note.evidence["generation"] == 1
    assert note.evidence["resume_step"] == 45 and note.key == "llm:0:memory-restored:45"


def test_the_restore_is_described_without_an_offered_checkpoint():
    text = describe_restore(MemoryRestore(MemoryGeneration(15, SHA), None, None, None))
    assert "no checkpoint was offered" in text and "training resumes at step 16" in text
