"""Stacks before the cancel, through the engine on the simulated cluster (engine/facts/hang_stacks.py):
captured once per hung attempt, the verdict in the hang's entry, its suspects kept out of the
restart; a capture that fails delays nothing and says why. The capture is the StackCapture port,
here a recorded one (the real one: tests/e2e/test_torch_stacks_slurm.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from unit.sim_world import SimWorld

from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.records import EventKind
from supervisor.domain.run import RunState
from supervisor.domain.stacks.dumps import Capture, RankDump, rank_dump
from supervisor.testing.kit.specs import spec

C10D = "torch/distributed/distributed_c10d.py"
SPEC = spec(script="/w/train.sbatch", nodes=4, workdir="/w", output="/logs/%x-%j.out", max_restarts=3)


def dump(node: str, rank: int, function: str, file: str) -> RankDump:
    frames = [{"name": function, "filename": file, "line": 1}]
    made = rank_dump(
        {"rank": rank, "pid": 100 + rank, "threads": [{"os_thread_id": 100 + rank, "frames": frames}]}, node
    )
    assert made is not None
    return made


@dataclass
class RecordedStacks:
    """Per call: every rank (2 a node) in all_reduce but ``stalled`` (a rank) in load_batch; with
    ``refused``, every node says ptrace was refused."""

    stalled: int | None = None
    refused: bool = False
    calls: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)

    def capture(self, job_id: int, nodes: Sequence[str]) -> Capture:
        self.calls.append((job_id, tuple(nodes)))
        if self.refused:
            return Capture((), dict.fromkeys(nodes, "ptrace refused (kernel.yama.ptrace_scope 3)"), 0.2)
        dumps = []
        for rank in range(2 * len(nodes)):
            where = ("load_batch", "/w/train.py") if rank == self.stalled else ("all_reduce", C10D)
            dumps.append(dump(nodes[rank // 2], rank, *where))
        return Capture(tuple(dumps), {}, 1.5)


def hung(tmp_path, stacks: RecordedStacks) -> SimWorld:
    """Rank-less progress lines up to step 30, then silence; ticks until the restart runs."""
    w = SimWorld(tmp_path, SPEC, nodes=6, probe=False, hang=HangSettings(multiple=3, floor_s=5, cap_s=600, startup_grace_s=60))  # fmt: skip
    w.stacks = stacks
    w.new_engine()
    step = 0
    for _ in range(3000):
        w.engine.tick()
        run = w.run()
        if run.attempt and run.attempt.seq == 1 and run.state is RunState.RUNNING:
            break
        path = f"/logs/llm-{run.attempt.job_id}.out" if run.attempt else ""
        if run.attempt and run.attempt.started_at and run.attempt.seq == 0 and step < 30 and path in w.logs:
            step += 1
            w.logs[path].append(json.dumps({"ssv": 1, "step": step}))
        w.clock.wait(1.0)
    return w


def test_the_rank_outside_the_collective_is_named_and_its_node_kept_out(tmp_path):
    stacks = RecordedStacks(stalled=5)
    w = hung(tmp_path, stacks)
    first = w.cluster.inspect().jobs[1000].nodes
    victim = first[5 // 2]
    assert stacks.calls == [(1000, first)]  # once, although the hang was seen on more ticks
    fault = w.events(EventKind.FAULT)[0]
    assert f"stacks: suspect {victim}: rank 5 ({victim}) in data loading (load_batch, /w/train.py:1)" in fault.message
    assert "while the other 7 ranks wait in all_reduce ×7" in fault.message
    assert fault.evidence["suspect_nodes"] == [victim] and fault.evidence["stacks"]["capture_s"] == 1.5
    run = w.run()
    assert victim in run.excluded and victim not in w.cluster.inspect().jobs[run.attempt.job_id].nodes


def test_every_rank_in_the_collective_blames_nobody(tmp_path):
    w = hung(tmp_path, RecordedStacks(stalled=None))
    fault = w.events(EventKind.FAULT)[0]
    assert "stacks: no single rank: all 8 ranks wait in collectives (all_reduce ×8)" in fault.message
    assert "suspect_nodes" not in fault.evidence and w.run().excluded == {}


def test_a_refused_capture_still_cancels_and_says_why(tmp_path):
    w = hung(tmp_path, RecordedStacks(refused=True))
    fault = w.events(EventKind.FAULT)[0]
    assert "stacks: no stacks: n" in fault.message and "ptrace refused" in fault.message
    assert "(after 0.2 s; the cancel follows)" in fault.message
    assert fault.evidence["stacks"]["captured"] is False and w.run().excluded == {}


def test_many_hung_runs_are_captured_at_once_and_the_tick_waits_one_deadline():
    import threading

    from supervisor.domain.cluster import ClusterSnapshot, JobInfo, JobState
    from supervisor.domain.records import AttemptRecord, RunRecord
    from supervisor.engine.facts.hang_stacks import MAX_AT_ONCE, HangStacks
    from supervisor.testing.kit.clock import ManualClock

    together = threading.Barrier(MAX_AT_ONCE, timeout=10)  # broken unless all of them run at once

    class Together(RecordedStacks):
        def capture(self, job_id, nodes):
            together.wait()
            return super().capture(job_id, nodes)

    runs, jobs = [], {}
    for i in range(MAX_AT_ONCE + 2):
        nodes = (f"a{i}", f"b{i}")
        one = spec(name=f"r{i}", script="/w/t.sbatch", nodes=2, workdir="/w")
        runs.append(
            RunRecord(one, RunState.RUNNING, attempt=AttemptRecord(f"r{i}", 0, 100 + i, 0, 0.0, nodes, started_at=1.0))
        )
        jobs[100 + i] = JobInfo(100 + i, f"r{i}", JobState.RUNNING, nodes=nodes)
    snap = ClusterSnapshot(2.0, jobs, {})
    hangs = {r.name: {"reason": "no new step", "last_step": 3} for r in runs}
    stacks = Together(stalled=1)
    watch = HangStacks(stacks, None, ManualClock())
    examined = watch.examine(runs, snap, hangs)
    assert len(stacks.calls) == MAX_AT_ONCE
    taken = [e for e in examined.values() if e["stacks"].get("ranks")]
    assert len(taken) == MAX_AT_ONCE and all("stacks: suspect a" in e["reason"] for e in taken)
    skipped = [e for e in examined.values() if not e["stacks"]["captured"]]
    assert len(skipped) == 2 and "more than 8 runs hung at once" in skipped[0]["reason"]
    assert watch.examine(runs, snap, hangs) == examined and len(stacks.calls) == MAX_AT_ONCE  # the next tick
