"""Uneven work in the engine, on the simulated cluster: a pipeline stage slower by design is logged
once as an imbalance and drains nothing; with the stage ids a trainer reports (the helper fills
them in for Megatron's layout), a slow node inside that stage is named against its stage."""

from __future__ import annotations

import json
import random

from unit.sim_world import SimWorld

from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.records import EventKind
from supervisor.domain.run import RunState
from supervisor.telemetry.jsonl import encode, megatron_peer_groups
from supervisor.testing.kit.specs import spec

SPEC = spec(script="/w/train.sbatch", nodes=9, workdir="/w", output="/logs/%x-%j.out")
RANKS_PER_NODE = 2
WORLD = 9 * RANKS_PER_NODE
STAGES = megatron_peer_groups(WORLD, pipeline=3, tensor=2)  # nodes 0-2, 3-5, 6-8: one stage each


def line(step: int, rng: random.Random, slow_rank: int | None, groups: bool) -> str:
    times = []
    for rank in range(WORLD):
        t = 1.0 * (1 + rng.gauss(0, 0.01)) * (1.5 if STAGES[rank] == 2 else 1.0)  # the last stage: loss
        times.append(t * (1.06 if rank == slow_rank else 1.0))
    return encode(
        step, loss=2.0, step_time_s=max(times), rank_step_times_s=times, rank_peer_groups=STAGES if groups else None
    )


def run(tmp_path, slow_rank: int | None, groups: bool, steps: int = 150) -> SimWorld:
    hang = HangSettings(multiple=50, floor_s=600, cap_s=3600, startup_grace_s=600)
    w = SimWorld(tmp_path, SPEC, nodes=10, probe=False, hang=hang)
    rng = random.Random(3)
    step = 0
    for _ in range(steps + 50):
        w.tick()
        r = w.run()
        if r.state is not RunState.RUNNING or r.attempt.started_at is None or r.attempt.seq != 0 or step >= steps:
            continue
        step += 1
        w.logs.append_all(line(step, rng, slow_rank if step > 40 else None, groups))
    return w


def test_a_slower_stage_is_logged_once_as_an_imbalance_and_nothing_is_degraded(tmp_path):
    w = run(tmp_path, slow_rank=None, groups=False)
    assert w.events(EventKind.NODE_DEGRADED) == []
    notes = [e for e in w.events(EventKind.NOTE) if "imbalance" in e.message]
    nodes = w.cluster.inspect().jobs[1000].nodes
    assert len(notes) == 1 and notes[0].evidence["nodes"] == list(nodes[6:9])
    assert "not a straggler" in notes[0].message and 1.4 < notes[0].evidence["level"] < 1.6
    assert not any(w.cluster.node_info(n).drained for n in nodes)


def test_with_stage_ids_a_slow_node_inside_the_slower_stage_is_named_against_its_stage(tmp_path):
    w = run(tmp_path, slow_rank=7 * RANKS_PER_NODE + 1, groups=True)
    (degraded,) = w.events(EventKind.NODE_DEGRADED)
    victim = w.cluster.inspect().jobs[1000].nodes[7]
    assert degraded.evidence["node"] == victim
    assert degraded.evidence["compared_with"] == "the median of its 2 peers (peer group 2)"
    assert [e for e in w.events(EventKind.NOTE) if "imbalance" in e.message] == []


def test_megatron_stage_ids_follow_the_rank_order():
    assert megatron_peer_groups(8, pipeline=2, tensor=2) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert megatron_peer_groups(8, pipeline=2, tensor=2, order="tp-pp-dp") == [0, 0, 1, 1, 0, 0, 1, 1]
    line_ = json.loads(encode(1, rank_peer_groups=megatron_peer_groups(4, pipeline=4)))
    assert line_["rank_peer_groups"] == [0, 1, 2, 3]


def test_stages_of_two_nodes_are_compared_with_their_own_start_up_pace():
    """Too few peers for a median: the slower stage is an imbalance, its nodes compared with their
    own start-up pace (a node turning 6 % slower than that is still named)."""
    from supervisor.domain.pace.stragglers import StragglerScorer, node_peer_groups

    stages = megatron_peer_groups(12, pipeline=3, tensor=2)  # 6 nodes of 2 ranks: 2 nodes per stage
    scorer = StragglerScorer(6, groups=node_peer_groups(stages, 2))
    rng = random.Random(5)
    named = set()
    for step in range(120):
        x = [
            (1 + rng.gauss(0, 0.01)) * (1.5 if n >= 4 else 1.0) * (1.06 if n == 5 and step > 40 else 1.0)
            for n in range(6)
        ]
        named |= {v.node for v in scorer.update(x)}
    assert named == {5}
    assert [imb.nodes for imb in scorer.imbalances] == [(4, 5)]


def test_hostile_peer_groups_are_read_as_not_said():
    from supervisor.domain.progress import parse_ssv_object

    record = parse_ssv_object(
        '{"ssv": 1, "step": 1, "rank_peer_groups": [0, null, "x", 99999999999999999999, -3, 2.0]}'
    )
    assert record is not None and record.rank_peer_groups == (0, -1, -1, -1, -1, -1)
    assert parse_ssv_object('{"ssv": 1, "step": 1, "rank_peer_groups": 7}').rank_peer_groups is None
