"""Stragglers and slowdowns in the engine, on the simulated cluster: a trainer reports per-rank step
times through the JSONL protocol; one node is 5 % slow. The supervisor names it, keeps the run
going until the next verified checkpoint, then restarts without it and drains it with the
evidence; the job's throughput drop is logged once, linked to the straggler."""

from __future__ import annotations

import json
import random

from unit.sim_world import SimWorld

from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.records import EventKind
from supervisor.domain.run import CheckpointPolicy, RunState, SparePolicy
from supervisor.testing.kit.specs import spec

SPEC = spec(
    script="/w/train.sbatch",
    nodes=6,
    workdir="/w",
    output="/logs/%x-%j.out",
    max_restarts=5,
    spare_policy=SparePolicy.NAMED,
    spare_nodes=("n008",),
    checkpoints=CheckpointPolicy(root="mem://ckpt/", scan_interval_s=5.0),
)


def jsonl(step: int, nodes: int, slow_node: int | None, rng: random.Random, slow: float = 1.05) -> str:
    ranks = []
    for n in range(nodes):
        for _ in range(8):
            t = 1.0 * (1 + rng.gauss(0, 0.01))
            ranks.append(t * (slow if n == slow_node else 1.0))
    step_time = max(ranks)
    return json.dumps(
        {
            "ssv": 1,
            "step": step,
            "loss": 2.0,
            "step_time_s": step_time,
            "tokens_per_s": 4e6 / step_time,
            "rank_step_times_s": ranks,
        }
    )


def test_a_5pct_straggler_is_named_and_dropped_at_the_next_checkpoint_with_the_slowdown_logged(tmp_path):
    hang = HangSettings(multiple=50, floor_s=600, cap_s=3600, startup_grace_s=600)
    w = SimWorld(tmp_path, SPEC, nodes=8, probe=False, hang=hang, watch_checkpoints=True)
    rng = random.Random(7)
    step = 0
    slow_node = None
    for _ in range(400):
        w.tick()
        run = w.run()
        if run.state is not RunState.RUNNING or run.attempt.started_at is None:
            continue
        if run.attempt.seq == 1:
            break
        nodes = run.attempt.nodes
        if step == 80:
            slow_node = 2  # from now on one node's GPUs run 5 % slow (thermal throttling, say)
        step += 1
        w.logs.append_all(jsonl(step, len(nodes), slow_node, rng))
        if step == 170:
            w.ckpt.save(step)  # the next checkpoint boundary
    run = w.run()
    assert run.attempt.seq == 1, "no restart at the checkpoint boundary"
    events = w.events()
    degraded = [e for e in events if e.kind is EventKind.NODE_DEGRADED]
    victim = w.cluster.inspect().jobs[1000].nodes[2]
    assert len(degraded) == 1 and degraded[0].evidence["node"] == victim
    assert "straggler" in degraded[0].message and degraded[0].evidence["rule"] == "straggler@1"
    named_at = degraded[0].evidence["step"]
    assert named_at - 80 <= 50  # a 5 % slower node named within 50 steps
    boundary = [e for e in events if e.kind is EventKind.FAULT and e.evidence.get("planned")]
    assert boundary and victim in boundary[0].evidence["nodes"]
    assert victim not in w.cluster.inspect().jobs[run.attempt.job_id].nodes
    info = w.cluster.node_info(victim)
    assert info.drained and not info.down and "straggler" in info.reason
    # the straggler dropped at the boundary is a fault quarantine counts (issue 21 item 7)
    assert [(f.node, f.source) for f in w.store.node_faults(0.0)] == [(victim, "degraded")]
    slowdown = [e for e in events if e.kind is EventKind.SLOWDOWN]
    assert len(slowdown) == 1 and victim in slowdown[0].message
    assert slowdown[0].evidence["drop"] >= 0.03
