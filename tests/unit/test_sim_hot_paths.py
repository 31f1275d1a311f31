"""What a 54-day, 2,048-node simulation reads every tick stays cheap as its history grows (issue 16),
and reads back exactly what was written."""

import random
from pathlib import Path

import hostlist
import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.checkpoints.manifest import CheckpointRef, Guarantee, Manifest
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.hostnames import fold
from supervisor.domain.observation import fmt_nodes
from supervisor.domain.progress import pauses
from supervisor.domain.records import NodeVerdict, Verdict
from supervisor.sim.clock import VirtualClock
from supervisor.sim.faults.health import SimHealthFeed
from supervisor.sim.runner import Simulation
from supervisor.sim.training.checkpoints import SimCheckpointStore
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.testing.kit.specs import spec

NEWEST_CHECKPOINTS = "SELECT * FROM checkpoints WHERE run = ? ORDER BY step DESC, first_seen DESC LIMIT ?"


def test_the_newest_checkpoints_are_read_through_an_index_not_a_sort_of_every_row(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    plan = " ".join(r[-1] for r in store._db.execute("EXPLAIN QUERY PLAN " + NEWEST_CHECKPOINTS, ("r", 64)))
    assert "TEMP B-TREE" not in plan and "INDEX" in plan, plan


def test_the_simulators_logbook_skips_the_sync_per_commit_the_daemons_keeps(tmp_path: Path) -> None:
    sim = Simulation(SimSettings(gpus=16, days=0.01), Mode.SUPERVISOR, tmp_path / "sim")
    simulated = sim.open_store(tmp_path / "sim")
    daemon = SqliteStore(tmp_path / "daemon")
    assert simulated._db.execute("PRAGMA synchronous").fetchone()[0] == 0  # OFF
    assert daemon._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_a_listing_hands_out_the_same_refs_until_a_save_changes() -> None:
    clock = VirtualClock()
    store = SimCheckpointStore(clock)
    t0 = clock.now()
    store.begin_save(100, t0, t0 + 5.0)
    store.begin_save(200, t0 + 10.0, t0 + 15.0)
    first = store.discover()
    assert [(r.step, r.committed) for r in first] == [(100, False)]  # step 200 not begun yet
    clock.advance(12.0)
    second = store.discover()
    assert second[0] is not first[0] and second[0].committed and second[0].seen_at == t0 + 5.0
    assert (second[1].step, second[1].committed, second[1].seen_at) == (200, False, t0 + 15.0)
    clock.advance(10.0)
    third = store.discover()
    assert third[0] is second[0]  # unchanged: not made again
    assert third[1].committed and third[1].location == "sim://checkpoints/run/step_00000200/"
    assert third[1].name == "step_00000200" and third[1].guarantee is Guarantee.MANIFEST
    store.attempt_ended(t0 + 12.0)  # its writer died before the manifest: torn after all
    torn = store.discover()
    assert torn[0] is third[0] and (torn[1].committed, torn[1].seen_at) == (False, t0 + 10.0)


def listed_from_scratch(store: SimCheckpointStore) -> list[CheckpointRef]:
    """What a listing says, made without the kept one."""
    now = store.clock.now()
    return [
        CheckpointRef(
            store.location(s.step),
            f"step_{s.step:08d}",
            s.step,
            Guarantee.MANIFEST,
            committed=s.committed(now),
            seen_at=s.committed_at or s.started_at,
        )
        for s in store.visible()
    ]


def test_the_kept_listing_says_what_a_fresh_one_would_whatever_the_saves_go_through() -> None:
    rng = random.Random(16)
    clock = VirtualClock()
    store = SimCheckpointStore(clock)
    step = 0
    for _ in range(600):
        roll, now = rng.random(), clock.now()
        if roll < 0.45:  # the next save, begun now or a little ahead of the clock
            step += 100
            begin = now + rng.choice((0.0, 3.0, 20.0))
            store.begin_save(step, begin, begin + rng.choice((5.0, 40.0)))
        elif roll < 0.55:  # a death, maybe noticed late: newer saves never happened, unfinished ones torn
            store.attempt_ended(now - rng.choice((0.0, 10.0)))
        elif roll < 0.65 and step:  # a restart from an older save begins its steps again
            step = max(0, step - 300)
        elif roll < 0.7 and (torn := [s for s in store.visible() if not s.committed(now)]):
            store.commit(f"step_{torn[-1].step:08d}", Manifest(torn[-1].step, ()))
        clock.advance(rng.choice((1.0, 7.0, 30.0)))
        assert store.discover() == listed_from_scratch(store)


def test_heartbeat_ages_live_agents_at_most_one_sample_silent_ones_since_they_stopped() -> None:
    clock = VirtualClock()
    feed = SimHealthFeed(clock, ["a", "b", "c"], sample_s=10.0)
    t0 = clock.now()
    clock.advance(4.0)
    feed._silent["b"] = t0 + 1.0
    assert feed.heartbeat_ages(clock.now()) == {"a": 4.0, "b": 3.0, "c": 4.0}
    assert list(feed.heartbeat_ages(clock.now() + 100.0).items()) == [("a", 10.0), ("b", 103.0), ("c", 10.0)]


def test_verdicts_read_again_show_each_change(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    store.set_verdict(NodeVerdict("n1", Verdict.SUSPECT, "probe failed", {"failures": 1}, "r", None, 5.0))
    assert store.verdicts() == store.verdicts()
    store.set_verdict(NodeVerdict("n1", Verdict.BAD, "probe failed", {"failures": 2}, "r", "drained", 6.0))
    store.set_node_action("n1", "returned", 7.0)
    (v,) = store.verdicts()
    assert (v.verdict, dict(v.evidence), v.action, v.at) == (Verdict.BAD, {"failures": 2}, "returned", 5.0)


def test_an_attempts_nodes_read_back_as_written(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    store.add_run(spec(name="r", script="/x.sh", partition="p"), now=1.0)
    nodes = tuple(f"n{i:04d}" for i in range(2048))
    first = store.add_attempt("r", 1000, 0, 2.0, excluded=("n9999",))
    store.attempt_started("r", first.seq, nodes, 3.0)
    for _ in range(2):
        (a,) = store.attempts("r")
        assert a.nodes == nodes and a.excluded == ("n9999",)


def test_thousands_of_nodes_are_named_as_a_hostlist_folded_once() -> None:
    nodes = tuple(f"n{i:04d}" for i in range(1, 2049) if i != 77)
    expected = f"{hostlist.collect_hostlist(list(nodes))} (2047 nodes)"
    assert fmt_nodes(nodes) == expected == fmt_nodes(list(nodes))  # type: ignore[arg-type]
    assert fmt_nodes(("n1", "n2")) == "n1,n2" and fmt_nodes(()) == "(no nodes)"


def test_pause_announcements_all_have_the_v_that_lets_step_lines_skip_the_search() -> None:
    for pattern in (pauses._STARTS.pattern, pauses._ENDS.pattern):
        assert all("v" in alternative.lower() for alternative in pattern.split("|")), pattern
    assert pauses.pause_of("[2024] SAVING CHECKPOINT at iteration 100 to /ckpt") == "a checkpoint save"
    assert pauses.pause_of('{"event": "eval_start"}') == "an evaluation"
    assert pauses.ends_pause("  successfully saved checkpoint from iteration 100")
    step = " iteration      100/  1000 | consumed samples: 204800 | elapsed time per iteration (ms): 6000.0 |"
    assert pauses.pause_of(step) is None and not pauses.ends_pause(step)


def test_names_fold_as_hostlist_folds_them_whatever_they_are() -> None:
    rng = random.Random(16)
    odd = (["n01x"], ["gpu7"], ["9"], ["n[1-2]"], ["n1,n2"], ["n٣٣٣٣"], ["n²"], ["m0001"], ["n12345"], ["n1"])
    for _ in range(1500):
        prefix, width = rng.choice(("n", "gpu", "node-", "a_b", "-", "é")), rng.randint(1, 5)
        numbers = [rng.randint(0, min(10**width - 1, 3000)) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.3:
            start = rng.randint(0, 10 ** (width - 1))
            numbers = list(range(start, min(10**width - 1, start + 40)))
        names = [f"{prefix}{n:0{width}d}" for n in numbers] + (rng.choice(odd) if rng.random() < 0.2 else [])
        rng.shuffle(names)
        try:
            expected = hostlist.collect_hostlist(names)
        except hostlist.BadHostlist:
            continue
        assert fold(names) == expected, names
    assert fold([f"n{i:04d}" for i in range(2048, 0, -1) if i != 1072]) == "n[0001-1071,1073-2048]"


def test_faults_and_verdicts_kept_between_reads_show_every_write_this_or_another_connection_makes(
    tmp_path: Path,
) -> None:
    store, other = SqliteStore(tmp_path), SqliteStore(tmp_path)
    store.record_node_fault(Fault("n1", 10.0, "r", "xid 79", "k1"))
    store.record_node_fault(Fault("n2", 20.0, "r", "xid 48", "k2"))
    assert [f.node for f in store.node_faults(0.0)] == ["n1", "n2"] and [f.node for f in store.node_faults(15.0)] == [
        "n2"
    ]
    assert store.node_faults(20.0)[0].at == 20.0 and store.node_faults(20.5) == []
    other.record_node_fault(Fault("n3", 15.0, "r", "ecc", "k3"))  # another process: the daemon's CLI, a hook
    assert [f.node for f in store.node_faults(12.0)] == ["n3", "n2"]
    other.set_verdict(NodeVerdict("n3", Verdict.BAD, "ecc", {}, "r", "drained", 15.0))
    assert [v.node for v in store.verdicts()] == ["n3"]
    with store.transaction():
        store.set_verdict(NodeVerdict("n4", Verdict.SUSPECT, "probe", {}, "r", None, 16.0))
        assert [v.node for v in store.verdicts()] == ["n3", "n4"]
    with pytest.raises(RuntimeError), store.transaction():
        store.set_verdict(NodeVerdict("n5", Verdict.SUSPECT, "probe", {}, "r", None, 17.0))
        assert len(store.verdicts()) == 3
        raise RuntimeError("rolled back")
    store.verdicts().clear()  # what a caller does with its list is its own
    assert [v.node for v in store.verdicts()] == ["n3", "n4"]
