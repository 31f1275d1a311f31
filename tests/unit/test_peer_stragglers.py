"""Like-with-like straggler scoring: pipeline stages slower by design, uneven sequence lengths and
nodes without peers name nobody; a slow node among its peers, or slower than its own past, is named."""

from __future__ import annotations

import numpy as np
import pytest
from unit.straggler_runs import first_named

from supervisor.domain.pace.peer_groups import PeerGroups
from supervisor.domain.pace.stragglers import StragglerScorer, node_peer_groups

NODES = 64


def trace(
    seed: int,
    steps: int,
    stage_factor: dict[range, float] | None = None,
    slow: dict[int, float] | None = None,
    onset: int = 0,
    seq_cv: float = 0.0,
) -> np.ndarray:
    """Step times (steps x nodes): the bench's noise model; nodes of a ``stage_factor`` range compute
    that many times longer; ``seq_cv`` adds independent per-node, per-step work (uneven sequences)."""
    rng = np.random.default_rng(seed)
    offset = rng.normal(0.0, 0.003, NODES)
    compute = 0.75 * (1.0 + offset + 0.012 * rng.standard_t(4, (steps, NODES)))
    if seq_cv:
        compute *= rng.lognormal(0.0, seq_cv, (steps, NODES))
    for nodes, factor in (stage_factor or {}).items():
        compute[:, nodes] *= factor
    x = compute + 0.25 * (1.0 + 0.05 * rng.standard_normal((steps, 1)))
    for node, s in (slow or {}).items():
        x[onset:, node] += s
    return x


def stages(pp: int) -> np.ndarray:
    return np.repeat(np.arange(pp), NODES // pp)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    "layout",
    [
        {range(56, 64): 1.5},  # the last of 8 stages (loss, output layer)
        {range(0, 8): 1.3, range(56, 64): 2.0},  # first and last stage, different costs
        {range(32, 64): 1.3},  # two stages: half the nodes slower
        {range(21, 42): 1.3, range(42, 64): 1.6},  # three costs side by side
    ],
)
def test_a_slower_stage_without_group_information_is_an_imbalance_never_a_straggler(seed, layout):
    scorer = StragglerScorer(NODES)
    assert first_named(scorer, trace(seed, 300, layout)) == {}
    slow_nodes = sorted(n for r in layout for n in r if layout[r] > 1.0)
    reported = sorted(n for imb in scorer.imbalances for n in imb.nodes)
    assert reported == slow_nodes or len(layout) == 1 and reported == slow_nodes
    assert all("not a straggler" in imb.reason and "not drained" in imb.reason for imb in scorer.imbalances)


@pytest.mark.parametrize("seed", range(3))
def test_uneven_sequence_lengths_name_nobody_and_make_no_block(seed):
    scorer = StragglerScorer(NODES)
    assert first_named(scorer, trace(seed, 600, seq_cv=0.12)) == {}
    assert scorer.imbalances == ()


@pytest.mark.parametrize("seed", range(3))
def test_a_node_of_a_slower_stage_that_becomes_slower_than_its_own_past_is_named(seed):
    x = trace(seed, 200, {range(56, 64): 1.5}, slow={60: 0.06}, onset=60)
    scorer = StragglerScorer(NODES)
    named = first_named(scorer, x)
    assert set(named) == {60} and named[60] - 60 <= 30
    (v,) = scorer.named()
    assert "own start-up pace (1.3" in v.reason and "x the median of its 63 peers" in v.reason


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("onset", [0, 20])
def test_with_stage_ids_a_slow_rank_inside_the_slower_stage_is_named_against_its_stage(seed, onset):
    x = trace(seed, 200, {range(56, 64): 1.5}, slow={58: 0.05}, onset=onset)
    scorer = StragglerScorer(NODES, groups=stages(8))
    named = first_named(scorer, x)
    assert set(named) == {58}
    (v,) = scorer.named()
    assert "median of its 7 peers (peer group 7)" in v.reason
    assert scorer.imbalances == ()


def test_without_group_information_a_lone_node_slow_from_the_start_is_still_named():
    named = first_named(StragglerScorer(NODES), trace(4, 200, slow={9: 0.05}, onset=0))
    assert set(named) == {9}


def test_nodes_without_enough_peers_are_compared_with_their_own_past():
    """16 nodes, 8 stages of 2 nodes (no median among 2): each node against its own start-up pace."""
    groups = stages(32)  # 2 nodes per group
    x = trace(5, 300, {range(62, 64): 1.8}, slow={10: 0.08}, onset=150)
    scorer = StragglerScorer(NODES, groups=groups)
    named = first_named(scorer, x)
    assert set(named) == {10}
    assert [imb.nodes for imb in scorer.imbalances] == [(62, 63)]
    assert "own start-up pace" in scorer.imbalances[0].reason


def test_imbalance_evidence_names_the_nodes_and_figures():
    names = [f"gpu{i:03d}" for i in range(NODES)]
    scorer = StragglerScorer(NODES, names)
    first_named(scorer, trace(1, 40, {range(56, 64): 1.4}))
    (imb,) = scorer.imbalances
    assert imb.names == tuple(names[56:64]) and 1.3 < imb.level < 1.5
    assert "gpu056 .. gpu063 (8 nodes side by side)" in imb.reason
    assert "slower than the median of their 63 peers" in imb.reason


def test_nobody_is_named_while_learning():
    scorer = StragglerScorer(NODES)
    x = trace(2, 16, slow={3: 0.5})
    assert all(scorer.update(row) == [] for row in x[:15])
    assert [v.node for v in scorer.update(x[15])] == [3] and not scorer.learning


def test_rank_groups_fold_into_node_groups():
    ranks = [0, 0, 0, 0, 1, 1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0]
    ids = node_peer_groups(ranks, 4)
    assert ids[0] == ids[3] != ids[1] != ids[2]


@pytest.mark.parametrize("seed", range(20))
def test_group_medians_match_numpy(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 200))
    ids = rng.integers(0, 5, n)
    values = rng.lognormal(0, 1, n)
    valid = rng.random(n) > 0.2
    groups = PeerGroups(ids, n)
    got = np.broadcast_to(groups.medians(values, valid), (n,))
    for i in range(n):
        mates = valid & (groups.ids == groups.ids[i])
        want = np.median(values[mates]) if mates.sum() >= 3 else np.nan
        assert got[i] == pytest.approx(want, rel=1e-9, nan_ok=True)
