"""Who hangs from every rank's stack (domain.stacks): where each rank waits, and the verdict."""

from __future__ import annotations

from supervisor.domain.stacks.dumps import RankDump, rank_dump
from supervisor.domain.stacks.places import Place, placement
from supervisor.domain.stacks.verdict import judge

C10D = "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py"
TRAIN = "/work/examples/torch/train.py"


def spy(*frames: tuple[str, str, int], pid: int = 100) -> list[dict[str, object]]:
    """py-spy dump --json's shape: a list of threads, frames innermost first."""
    return [
        {
            "pid": pid,
            "thread_name": "MainThread",
            "os_thread_id": pid,
            "frames": [{"name": n, "filename": f, "line": line} for n, f, line in frames],
        }
    ]


def rank(r: int, node: str, *frames: tuple[str, str, int]) -> RankDump:
    made = rank_dump({"rank": r, "pid": 100 + r, "threads": spy(*frames, pid=100 + r)}, node)
    assert made is not None
    return made


ALL_REDUCE = (
    ("all_reduce", C10D, 2501),
    ("wrapper", "torch/distributed/c10d_logger.py", 81),
    ("average_gradients", TRAIN, 140),
)
LOADER = (("load_batch", TRAIN, 131), ("train_step", TRAIN, 374), ("train", TRAIN, 300))
RECV = (("recv", C10D, 2300), ("stall", TRAIN, 99))


def test_places_of_the_usual_stacks():
    assert placement(rank(0, "n1", *ALL_REDUCE)).place is Place.COLLECTIVE
    assert placement(rank(0, "n1", *ALL_REDUCE)).what == "all_reduce"
    assert placement(rank(0, "n1", *LOADER)).place is Place.DATA
    assert placement(rank(0, "n1", ("__next__", "torch/utils/data/dataloader.py", 700))).place is Place.DATA
    assert (
        placement(rank(0, "n1", ("save", "torch/distributed/checkpoint/state_dict_saver.py", 40))).place
        is Place.CHECKPOINT
    )
    assert placement(rank(0, "n1", ("forward", TRAIN, 50))).place is Place.ELSEWHERE
    # a barrier inside a save waits on peers: the innermost frame that names a place decides
    barrier_in_save = (("barrier", C10D, 4000), ("save_checkpoint", TRAIN, 10))
    assert placement(rank(0, "n1", *barrier_in_save)).place is Place.COLLECTIVE
    failed = rank_dump({"rank": 1, "pid": 7, "error": "ptrace refused"}, "n1")
    assert failed is not None and placement(failed).place is Place.UNKNOWN


def test_the_one_rank_outside_the_all_reduce_is_singled_out_with_its_node():
    dumps = [rank(0, "n1", *ALL_REDUCE), rank(1, "n2", *LOADER)]
    v = judge(dumps, ["n1", "n2"], {})
    assert v.singled_out and v.suspects == (1,) and v.nodes == ("n2",)
    assert v.summary.startswith("suspect n2: rank 1 (n2) in data loading (load_batch, ")
    assert v.summary.endswith("while the other rank waits in all_reduce ×1")
    places = {g.place.value: g.ranks for g in v.groups}
    assert places == {"collective": (0,), "data loading": (1,)}


def test_every_rank_in_a_collective_is_no_single_rank():
    v = judge([rank(0, "n1", *ALL_REDUCE), rank(1, "n2", *RECV)], ["n1", "n2"], {})
    assert not v.singled_out and v.nodes == () and v.suspects == ()
    assert v.summary == "no single rank: all 2 ranks wait in collectives (all_reduce ×1, recv ×1)"


def test_no_rank_in_a_collective_blames_nobody():
    v = judge([rank(0, "n1", *LOADER), rank(1, "n2", *LOADER)], ["n1", "n2"], {})
    assert not v.singled_out and v.summary.startswith("no single rank: no rank waits in a collective")


def test_a_node_without_stacks_is_unverified_not_guilty():
    v = judge([rank(0, "n1", *ALL_REDUCE), rank(2, "n3", *LOADER)], ["n1", "n2", "n3"], {"n2": "ptrace refused"})
    assert not v.singled_out and v.nodes == ()
    assert "no stacks from n2" in v.summary
    none = judge([], ["n1"], {"n1": "py-spy not found"})
    assert none.ranks == 0 and none.summary == "no stacks: n1: py-spy not found"


def test_too_many_outside_or_too_many_nodes_is_no_single_rank():
    # half the ranks outside but more outside than waiting: nobody is blamed
    dumps = [rank(0, "n1", *ALL_REDUCE), rank(1, "n2", *LOADER), rank(2, "n3", *LOADER)]
    assert not judge(dumps, ["n1", "n2", "n3"], {}).singled_out
    # 16 nodes: at most 2 may be singled out
    dumps = [rank(i, f"n{i}", *ALL_REDUCE) for i in range(13)] + [rank(i, f"n{i}", *LOADER) for i in range(13, 16)]
    v = judge(dumps, [f"n{i}" for i in range(16)], {})
    assert not v.singled_out and v.summary.startswith("no single rank: 3 of 16 ranks are outside the collective")
    dumps = [rank(i, f"n{i}", *ALL_REDUCE) for i in range(14)] + [rank(i, f"n{i}", *LOADER) for i in range(14, 16)]
    assert judge(dumps, [f"n{i}" for i in range(16)], {}).nodes == ("n14", "n15")


def test_the_evidence_is_bounded_and_round_trips():
    dumps = [rank(i, f"n{i // 8}", *ALL_REDUCE) for i in range(500)]
    ev = judge(dumps, [f"n{i}" for i in range(63)], {}).evidence()
    assert ev["groups"][0]["rank_count"] == 500 and len(ev["groups"][0]["ranks"]) == 64
    assert len(ev["groups"][0]["stack"]) == 3
    back = rank_dump(dumps[3].to_json(), "n0")
    assert back == dumps[3]


def test_a_stack_that_moved_between_two_samples_blames_nobody():
    # one snapshot of a healthy job also shows a rank outside a collective: a hang's stands still
    computing = rank_dump({"rank": 1, "pid": 7, "threads": spy(*LOADER, pid=7), "moved": True}, "n2")
    assert computing is not None
    v = judge([rank(0, "n1", *ALL_REDUCE), computing], ["n1", "n2"], {})
    assert not v.singled_out and v.nodes == ()
    assert v.summary == "no single rank: the stacks of rank(s) 1 (n2) moved between two samples (the job still runs)"
