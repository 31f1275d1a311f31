"""Who hangs: per-rank progress names the stopped rank's node in a hang's evidence, and the restart
keeps that node out only when the evidence singles it out."""

from __future__ import annotations

import json

import pytest
from unit.sim_world import SimWorld

from supervisor.domain.progress import parser_for
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.progress.ranks import RankProgress, idle_suspects, suspects
from supervisor.domain.records import EventKind
from supervisor.domain.run import RunState
from supervisor.testing.kit.specs import spec

NODES = ("n0", "n1", "n2", "n3")


def progress(steps: dict[int, int]) -> RankProgress:
    p = RankProgress()
    for rank, step in steps.items():
        p.observe(rank, step, float(step))
    return p


def test_one_rank_far_behind_all_others_is_singled_out_with_its_node():
    found = suspects(progress({r: 40 if r != 6 else 30 for r in range(16)}), NODES)
    assert found is not None and found.singled_out
    assert found.ranks == (6,) and found.nodes == ("n1",)
    assert "rank 6 at step 30 (n1)" in found.summary and "other 15 ranks, which reached step 40" in found.summary


def test_ranks_all_at_the_same_step_single_out_nobody():
    found = suspects(progress(dict.fromkeys(range(16), 40)), NODES)
    assert found is not None and not found.singled_out and found.nodes == ()
    assert found.summary.startswith("no single rank")


@pytest.mark.parametrize(
    "behind",
    [
        set(range(8)),  # half the ranks: a job-wide problem, not one node
        {0, 5, 9, 13},  # one rank on every node
    ],
)
def test_many_ranks_behind_single_out_nobody(behind):
    found = suspects(progress({r: 30 if r in behind else 40 for r in range(16)}), NODES)
    assert found is not None and not found.singled_out and found.nodes == ()
    assert "no single rank" in found.summary


def test_unknown_layout_names_ranks_but_no_node():
    found = suspects(progress({r: 30 if r == 2 else 40 for r in range(6)}), NODES)  # 6 ranks on 4 nodes
    assert found is not None and not found.singled_out and found.ranks == (2,)


def test_one_reporting_rank_says_nothing_and_memory_is_bounded():
    assert suspects(progress({0: 40}), NODES) is None
    p = RankProgress()
    for r in range(70000):
        p.observe(r, 1, 0.0)
    assert len(p.steps) == 65536


def test_a_step_going_back_starts_the_positions_again():
    p = progress({0: 40, 1: 40, 2: 30})
    p.observe(0, 10, 50.0)  # the trainer restarted from a checkpoint
    assert p.steps == {0: 10}


def test_idle_gpus_among_busy_ones_single_out_their_node():
    assert idle_suspects({"n0": 99.0, "n1": 1.0, "n2": 98.0, "n3": 100.0, **{f"m{i}": 97.0 for i in range(4)}}) == (
        "n1",
    )
    assert idle_suspects({"n0": 0.0, "n1": 1.0, "n2": 2.0, "n3": 0.0}) == ()  # everyone idle: no one singled out
    assert idle_suspects({"n0": 0.0, "n1": 1.0, "n2": 98.0, "n3": 97.0}) == ()  # half of them: too many


def test_rank_lines_are_read_with_their_rank():
    parser = parser_for("ssv-jsonl")
    (record,) = parser.feed(json.dumps({"ssv": 1, "step": 7, "rank": 12}))
    assert record.rank == 12 and record.step == 7


SPEC = spec(script="/w/train.sbatch", nodes=4, workdir="/w", output="/logs/%x-%j.out", max_restarts=3)
RANKS = 16  # 4 per node


def run_until_restart(tmp_path, stuck_rank: int | None) -> SimWorld:
    """Every rank reports each step for itself; from step 30 ``stuck_rank`` reports nothing more
    and the others report until step 32 (the steps in flight), then the whole job waits on it.
    ``None``: every rank stops at step 32 together."""
    settings = HangSettings(multiple=3, floor_s=5, cap_s=600, startup_grace_s=60)
    w = SimWorld(tmp_path, SPEC, nodes=6, probe=False, hang=settings)
    step = 0
    for _ in range(3000):
        w.engine.tick()
        run = w.run()
        if run.attempt and run.attempt.seq == 1 and run.state is RunState.RUNNING:
            break
        if run.attempt and run.attempt.started_at and run.attempt.seq == 0 and step < 32:
            path = f"/logs/llm-{run.attempt.job_id}.out"
            if path in w.logs:
                step += 1
                for rank in range(RANKS):
                    if rank != stuck_rank or step <= 30:
                        w.logs[path].append(json.dumps({"ssv": 1, "step": step, "rank": rank}))
        w.clock.wait(1.0)
    return w


def test_a_hang_where_one_rank_stopped_names_its_node_and_the_restart_keeps_it_out(tmp_path):
    w = run_until_restart(tmp_path, stuck_rank=6)
    first_nodes = w.cluster.inspect().jobs[1000].nodes
    victim = first_nodes[6 // 4]
    fault = w.events(EventKind.FAULT)[0]
    assert "hang" in fault.message and f"suspect {victim}: rank 6 at step 30" in fault.message
    assert fault.evidence["suspect_nodes"] == [victim] and fault.evidence["ranks_behind"] == [6]
    run = w.run()
    assert victim in run.excluded and run.attempt.seq == 1
    assert victim not in w.cluster.inspect().jobs[run.attempt.job_id].nodes


def test_a_hang_where_every_rank_stopped_together_blames_no_node(tmp_path):
    w = run_until_restart(tmp_path, stuck_rank=None)
    fault = w.events(EventKind.FAULT)[0]
    assert "no single rank: all 16 reporting ranks stopped at step 32" in fault.message
    assert fault.evidence["suspect_nodes"] == []
    assert w.run().excluded == {}
