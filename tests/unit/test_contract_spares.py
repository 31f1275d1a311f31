"""``spares.exclusions_for`` on plain data: the ``--exclude`` list of a run's next job — nodes bad
for the run always, named spares until the partition runs short of idle nodes."""

from supervisor.domain.cluster import ClusterSnapshot, NodeInfo, NodeState
from supervisor.domain.decide.spares import exclusions_for
from supervisor.domain.records import RunRecord
from supervisor.domain.run import RunSpec, RunState, SparePolicy


def spec(**kw):
    base = dict(name="r", script="/s.sh", partition="main", nodes=2, spare_policy=SparePolicy.NAMED)
    return RunSpec(**{**base, **kw})


def record(s, excluded=(), deferred=()):
    return RunRecord(
        spec=s,
        state=RunState.RECOVERING,
        excluded=dict.fromkeys(excluded, "bad"),
        deferred=dict.fromkeys(deferred, (0.0, "slow")),
    )


def cluster(busy=(), other_partition=()):
    nodes = {}
    for i in range(1, 7):
        name = f"n{i}"
        state = NodeState.ALLOCATED if name in busy else NodeState.IDLE
        nodes[name] = NodeInfo(name, state, partitions=("other",) if name in other_partition else ("main",))
    return ClusterSnapshot(0.0, {}, nodes)


def test_without_spares_only_the_bad_nodes_sorted():
    r = record(spec(spare_policy=SparePolicy.NAMED), excluded=("n3",), deferred=("n1",))
    assert exclusions_for(r, cluster(), also=("n5",)) == ("n1", "n3", "n5")


def test_partition_idle_spec_with_spare_nodes_excludes_only_the_bad_nodes():
    r = record(spec(spare_policy=SparePolicy.PARTITION_IDLE, spare_nodes=("n5", "n6")), excluded=("n1",))
    assert exclusions_for(r, cluster()) == ("n1",)


def test_named_spares_are_kept_out_while_enough_regular_nodes_are_idle():
    r = record(spec(spare_nodes=("n5", "n6")), excluded=("n1",))
    assert exclusions_for(r, cluster()) == ("n1", "n5", "n6")


def test_exactly_enough_idle_regular_nodes_needs_no_spare():
    r = record(spec(spare_nodes=("n5", "n6")))
    assert exclusions_for(r, cluster(busy=("n1", "n2"))) == ("n5", "n6")  # n3, n4 idle: 2 of 2


def test_as_many_idle_spares_as_the_shortfall_are_let_in_in_name_order():
    r = record(spec(spare_nodes=("n6", "n5")), excluded=("n1",))
    # idle regular: n4 only (n1 bad, n2 n3 busy): short by one: n5 (first by name) is let in
    assert exclusions_for(r, cluster(busy=("n2", "n3"))) == ("n1", "n6")
    # no idle regular node: both spares
    assert exclusions_for(r, cluster(busy=("n2", "n3", "n4"))) == ("n1",)


def test_a_busy_spare_stays_excluded_and_a_bad_spare_counts_as_bad():
    r = record(spec(spare_nodes=("n5", "n6")), excluded=("n6",))
    assert exclusions_for(r, cluster(busy=("n2", "n3", "n4", "n5"))) == ("n5", "n6")


def test_spares_outside_the_partition_are_never_let_in_and_quarantined_nodes_are_not_counted():
    r = record(spec(spare_nodes=("n5", "n6")))
    snap = cluster(busy=("n2", "n3"), other_partition=("n5",))
    # idle regular: n1 and n4, but n4 is quarantined ("also"): short by one; n5 is not in main
    assert exclusions_for(r, snap, also=("n4",)) == ("n4", "n5")


def test_node_count_sets_the_shortfall():
    four, five = record(spec(nodes=4, spare_nodes=("n5", "n6"))), record(spec(nodes=5, spare_nodes=("n5", "n6")))
    assert exclusions_for(four, cluster()) == ("n5", "n6")  # n1..n4 idle: enough
    assert exclusions_for(five, cluster()) == ("n6",)  # short by one


def test_a_node_both_excluded_deferred_and_quarantined_stays_out():
    r = record(spec(spare_nodes=("n6",)), excluded=("n1", "n2"), deferred=("n1", "n3"))
    assert exclusions_for(r, cluster(), also=("n2", "n3")) == ("n1", "n2", "n3", "n6")
    r = record(spec(spare_policy=SparePolicy.PARTITION_IDLE), excluded=("n1",), deferred=("n1", "n2"))
    assert exclusions_for(r, cluster(), also=("n1", "n2")) == ("n1", "n2")
