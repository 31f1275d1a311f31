"""The blast radius on plain data: drains the supervisor made and drains its Slurm hooks made,
counted per hour across the cluster and per run."""

from supervisor.domain.cluster import NodeInfo, NodeState
from supervisor.domain.decide.blast import (
    BlastRadius,
    HookDrain,
    NodeChangeRecord,
    drains_left,
    hook_drained,
    track_hook_drains,
)

CAPS = BlastRadius(per_hour=4, per_run_per_hour=2)
NOW = 10_000.0


def drain(node: str, run: str = "a", at: float = NOW - 60) -> NodeChangeRecord:
    return NodeChangeRecord(node, run, "DRAIN", at)


def test_the_supervisors_own_drains_count_per_run_and_everywhere():
    changes = [drain("n1"), drain("n1"), drain("n2", "b"), drain("n3", at=NOW - 7200)]  # n3: an hour ago
    assert drains_left(changes, "a", NOW, CAPS) == 1  # one of a's two (n1, counted once)
    assert drains_left(changes, "c", NOW, CAPS) == 2  # cluster: 4 - 2


def test_a_node_a_hook_drained_within_the_hour_counts_like_a_drain_of_ours():
    hooks = [HookDrain("h1", NOW - 600), HookDrain("h2", NOW - 300)]
    assert drains_left([], "a", NOW, CAPS, hooks) == 2  # not a's nodes: the cluster-wide cap only
    assert drains_left([drain("n1")], "a", NOW, CAPS, hooks) == 1  # 4 - 3 everywhere, 2 - 1 for a
    assert drains_left([drain("n1")], "a", NOW, CAPS, hooks, run_nodes=("h1", "n1")) == 0  # h1 was a's
    assert drains_left([], "a", NOW, CAPS, [HookDrain("h1", NOW - 4000)]) == 2  # older than the window


def test_a_node_both_we_and_a_hook_drained_counts_once():
    assert drains_left([drain("n1")], "a", NOW, CAPS, [HookDrain("n1", NOW - 10)], ("n1",)) == 1


def test_hook_drains_are_read_from_the_hooks_reason_and_slurms_prolog_error():
    nodes = [
        NodeInfo("h1", NodeState.IDLE, frozenset({"DRAIN"}), "slurm-supervisor healthcheck: XID 79 [rule xid-79@1]"),
        NodeInfo("p1", NodeState.IDLE, frozenset({"DRAIN"}), "Prolog error", prolog_failed=True),
        NodeInfo("s1", NodeState.IDLE, frozenset({"DRAIN"}), "slurm-supervisor: run a: XID 79"),  # ours: a record
        NodeInfo("x1", NodeState.IDLE, frozenset({"DRAIN"}), "admin: new cables"),
        NodeInfo("r1", NodeState.IDLE, frozenset(), "slurm-supervisor healthcheck: XID 79 (resumed)"),
    ]
    assert hook_drained(nodes) == {"h1", "p1"}


def test_a_hook_drain_counts_from_when_it_was_first_seen_until_the_node_returns():
    seen = track_hook_drains({}, {"h1"}, 100.0)
    seen = track_hook_drains(seen, {"h1", "h2"}, 200.0)
    assert seen == {"h1": 100.0, "h2": 200.0}
    assert track_hook_drains(seen, {"h2"}, 300.0) == {"h2": 200.0}  # h1 back in service: forgotten
