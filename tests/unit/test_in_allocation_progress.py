"""Reading an in-allocation run's log: the training step runs on ``nodes`` of a job that holds
hot spares too, and on other nodes after each swap. Per-rank times map to the step's nodes (they
were laid over the whole allocation: a straggler's ranks were blamed on the wrong node, or not
scored at all); a new generation restores from its checkpoint before its first step, and the
hang detector gives that the start-up grace (a restore longer than the learned threshold was
called a hang, and the run resubmitted)."""

from __future__ import annotations

import json
import random

from supervisor.domain.alloc_step import AllocationStep, StepGoal
from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.records import AttemptRecord, RunRecord
from supervisor.domain.run import RestartMode, RunState
from supervisor.domain.spikes.events import SpikeEvent
from supervisor.engine.watch.progress import ProgressWatch
from supervisor.testing.kit.logs import MemoryLogs
from supervisor.testing.kit.specs import spec

SPEC = spec(
    script="/w/t.sh",
    nodes=4,
    workdir="/w",
    output="/logs/%x-%j.out",
    restart_mode=RestartMode.IN_ALLOCATION,
    hot_spares=2,
)
ALLOCATION = ("n1", "n2", "n3", "n4", "n5", "n6")  # the step: n1-n4; hot spares n5, n6
A0 = AttemptRecord("llm", 0, 7, 0, 10.0, nodes=ALLOCATION, started_at=20.0)
JOB = JobInfo(7, "llm", JobState.RUNNING, nodes=ALLOCATION, start_time=20.0, stdout="/logs/llm-7.out")
RANKS_PER_NODE = 3


def line(step: int, slow_node: int | None, rng: random.Random) -> str:
    ranks = [
        (1.10 if n == slow_node else 1.0) * (1 + rng.gauss(0, 0.005)) for n in range(4) for _ in range(RANKS_PER_NODE)
    ]
    return json.dumps({"ssv": 1, "step": step, "loss": 2.0, "step_time_s": max(ranks), "rank_step_times_s": ranks})


def run(goal: StepGoal | None = None) -> RunRecord:
    return RunRecord(spec=SPEC, state=RunState.RUNNING, attempt=A0, step=AllocationStep(goal))


def follow(watch: ProgressWatch, logs: MemoryLogs, record: RunRecord, steps: range, slow: int | None, t: float):
    rng = random.Random(3)
    watch.update([record], ClusterSnapshot(t, {7: JOB}), t)  # follows the job's output from now
    for step in steps:
        logs["/logs/llm-7.out"].append(line(step, slow, rng))
        t += 1.0
        watch.update([record], ClusterSnapshot(t, {7: JOB}), t)
    return t


def test_a_straggler_in_the_step_is_named_by_the_step_nodes_not_the_allocation():
    logs = MemoryLogs()
    watch = ProgressWatch(logs, HangSettings())
    follow(watch, logs, run(), range(1, 80), 2, 100.0)  # the step's third node (n3) 10 % slower
    named = {f.node for f in watch.take_findings()}
    assert named == {"n3"}, named  # laid over six nodes, its ranks were n4's and n5's


def test_after_a_swap_the_ranks_are_the_new_generations_nodes():
    logs = MemoryLogs()
    watch = ProgressWatch(logs, HangSettings())
    t = follow(watch, logs, run(), range(1, 30), None, 100.0)
    goal = StepGoal(7, 1, ("n1", "n2", "n4", "n5"), "n3 died", t)  # n3 out, spare n5 in
    follow(watch, logs, run(goal), range(20, 100), 2, t + 60.0)  # the generation's third node: n4
    assert {f.node for f in watch.take_findings()} == {"n4"}


def test_a_new_generations_restore_is_given_the_start_up_grace_not_called_a_hang():
    logs = MemoryLogs()
    settings = HangSettings(floor_s=120.0, startup_grace_s=1800.0)
    watch = ProgressWatch(logs, settings)
    t = follow(watch, logs, run(), range(1, 40), None, 100.0)  # a pace learned: threshold 120 s
    goal = StepGoal(7, 1, ("n1", "n2", "n4", "n5"), "n3 died", t)
    restoring = t + 600.0  # a 405B model's restore: 10 minutes before its first step
    assert watch.update([run(goal)], ClusterSnapshot(restoring, {7: JOB}), restoring) == {}
    late = goal.decided_at + settings.startup_grace_s + 1
    assert "llm" in watch.update([run(goal)], ClusterSnapshot(late, {7: JOB}), late)  # a real hang still is one


def test_a_generation_resumed_past_the_last_step_read_ends_the_grace_with_its_first_step():
    """The log lags the checkpoints (buffered output): the new generation resumes past the last step
    the daemon had read. Its steps are progress, not the old generation's last lines."""
    logs = MemoryLogs()
    watch = ProgressWatch(logs, HangSettings(floor_s=120.0, startup_grace_s=1800.0))
    t = follow(watch, logs, run(), range(1, 40), None, 100.0)
    goal = StepGoal(7, 1, ("n1", "n2", "n4", "n5"), "n3 died", t)
    t = follow(watch, logs, run(goal), range(50, 60), None, t + 120.0)  # resumed from step 49
    quiet = t + 200.0  # then a real hang: judged by the learned threshold again, not the grace
    assert "llm" in watch.update([run(goal)], ClusterSnapshot(quiet, {7: JOB}), quiet)


def test_a_new_generation_is_watched_for_loss_spikes_from_the_step_it_resumes_at():
    """It resumes from a checkpoint before the old generation's last step: a spike in the steps
    it trains again was ignored (the detector took them for duplicated lines)."""
    logs, rng = MemoryLogs(), random.Random(5)
    watch = ProgressWatch(logs, HangSettings())
    record, t = run(), 100.0

    def train(steps: range, record: RunRecord, spike_at: int | None = None) -> None:
        nonlocal t
        for step in steps:
            loss = (8.0 if step == spike_at else 2.0) * (1 + rng.gauss(0, 0.01))
            logs["/logs/llm-7.out"].append(json.dumps({"ssv": 1, "step": step, "loss": loss, "grad_norm": 1.0}))
            t += 1.0
            watch.update([record], ClusterSnapshot(t, {7: JOB}), t)

    watch.update([record], ClusterSnapshot(t, {7: JOB}), t)
    train(range(1, 200), record)
    assert not watch.take_notices()
    goal = StepGoal(7, 1, ALLOCATION[:4], "relaunched in place", t)
    train(range(101, 180), run(goal), spike_at=150)  # resumed from the checkpoint at step 100
    onsets = [n.notice.onset_step for n in watch.take_notices() if isinstance(n.notice, SpikeEvent)]
    assert onsets == [150]
