"""Recognising checkpoints in a listing (plain data): our manifest layout, torn ones, PyTorch DCP,
Megatron, NeMo, nested roots; the weak presence checks of adopted layouts; and a property test
that discovery never raises on arbitrary keys."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.domain.checkpoints.adopted import check_adopted
from supervisor.domain.checkpoints.layouts import discover, wanted_texts
from supervisor.domain.checkpoints.manifest import CheckpointRef, Guarantee, ObjectInfo

ROOT = "s3://bucket/run42/"


def locate(prefix: str) -> str:
    return ROOT + prefix


def objs(*specs: str | tuple[str, int] | tuple[str, int, float]) -> list[ObjectInfo]:
    """ "key" (10 bytes, t=100), ("key", size) or ("key", size, mtime)."""
    out = []
    for spec in specs:
        if isinstance(spec, str):
            out.append(ObjectInfo(spec, 10, modified_at=100.0))
        elif len(spec) == 2:
            out.append(ObjectInfo(spec[0], spec[1], modified_at=100.0))
        else:
            out.append(ObjectInfo(spec[0], spec[1], modified_at=spec[2]))
    return out


def by_name(refs: Iterable[CheckpointRef]) -> dict[str, CheckpointRef]:
    return {r.name: r for r in refs}


# --------------------------------------------------------------------------- ours


def test_manifest_prefix_is_committed_and_step_named_prefix_without_it_is_torn() -> None:
    refs = by_name(
        discover(
            objs(
                ("step_000100/model/rank0.pt", 10, 50.0),
                ("step_000100/ssv-manifest.json", 10, 60.0),
                "step_000200/model/rank0.pt",
                "step_000200/model/rank1.pt",
                "global_step300/mp_rank_00_model_states.pt",
                "checkpoint-400/pytorch_model.bin",
                "notes/readme.txt",
            ),
            locate,
        )
    )
    assert set(refs) == {"step_000100", "step_000200", "global_step300", "checkpoint-400"}
    ok = refs["step_000100"]
    assert (ok.guarantee, ok.committed, ok.step, ok.location, ok.seen_at) == (
        Guarantee.MANIFEST,
        True,
        100,
        ROOT + "step_000100/",
        60.0,
    )
    for torn in ("step_000200", "global_step300", "checkpoint-400"):
        assert refs[torn].guarantee is Guarantee.MANIFEST and not refs[torn].committed
    assert [refs[n].step for n in ("step_000200", "global_step300", "checkpoint-400")] == [200, 300, 400]


def test_refs_come_oldest_step_first() -> None:
    refs = discover(objs("step_3/ssv-manifest.json", "step_10/ssv-manifest.json", "step_2/a"), locate)
    assert [r.step for r in refs] == [2, 3, 10]


def test_nested_roots_two_levels_down() -> None:
    refs = discover(
        objs(
            "exp1/ckpt/step_000100/ssv-manifest.json",
            "exp1/ckpt/step_000100/a.bin",
            "exp2/ckpt/iter_0000050/.metadata",
            "exp2/ckpt/iter_0000050/__0_0.distcp",
            "exp3/ckpt/iter_0000070/.metadata",
            "exp3/ckpt/iter_0000070/__0_0.distcp",
            "exp3/ckpt/iter_0000070/common.pt",
        ),
        locate,
    )
    assert [(r.location, r.guarantee, r.committed) for r in refs] == [
        (ROOT + "exp2/ckpt/iter_0000050/", Guarantee.DCP, True),
        (ROOT + "exp3/ckpt/iter_0000070/", Guarantee.MEGATRON, False),  # no tracker yet
        (ROOT + "exp1/ckpt/step_000100/", Guarantee.MANIFEST, True),
    ]


def test_manifest_at_the_root_itself() -> None:
    (ref,) = discover(objs("ssv-manifest.json", "a.bin"), lambda p: "/lustre/run/step_000700/" + p)
    assert (ref.location, ref.name, ref.step, ref.committed) == ("/lustre/run/step_000700/", "step_000700", 700, True)


def test_manifest_wins_over_the_dcp_files_beside_it() -> None:
    (ref,) = discover(objs("step_5/.metadata", "step_5/__0_0.distcp", "step_5/ssv-manifest.json"), locate)
    assert ref.guarantee is Guarantee.MANIFEST


def test_plain_directories_and_loose_files_are_not_checkpoints() -> None:
    assert discover(objs("logs/train.log", "config.yaml", "tokenizer/vocab.json"), locate) == []


# --------------------------------------------------------------------------- PyTorch DCP


def test_dcp_is_committed_once_metadata_exists() -> None:
    refs = by_name(
        discover(
            objs(
                "dcp_step_10/__0_0.distcp",
                "dcp_step_10/__1_0.distcp",
                "dcp_step_10/.metadata",
                "dcp_step_20/__0_0.distcp",
                "dcp_step_20/.metadata.tmp",
            ),
            locate,
        )
    )
    assert (refs["dcp_step_10"].guarantee, refs["dcp_step_10"].committed, refs["dcp_step_10"].step) == (
        Guarantee.DCP,
        True,
        10,
    )
    assert (refs["dcp_step_20"].guarantee, refs["dcp_step_20"].committed) == (Guarantee.DCP, False)


def test_dcp_step_comes_from_a_step_named_parent() -> None:
    (ref,) = discover(objs("step_000300/model/.metadata", "step_000300/model/__0_0.distcp"), locate)
    assert (ref.name, ref.step, ref.guarantee) == ("model", 300, Guarantee.DCP)


def test_check_dcp_presence() -> None:
    good = objs("ck/.metadata", "ck/__0_0.distcp", ("ck/__1_0.distcp", 5))
    (ref,) = discover(good, locate)
    assert check_adopted(ref, good) == ()
    bad = objs(("ck/.metadata", 0), ("ck/__0_0.distcp", 0), "ck/.metadata.tmp")
    (ref,) = discover(bad, locate)
    kinds = {(p.key, p.problem) for p in check_adopted(ref, bad)}
    assert kinds == {
        (".metadata", "size"),
        (".metadata.tmp", "uncommitted"),
        (".", "missing"),
        ("__0_0.distcp", "size"),
    }


def test_check_adopted_reports_uncommitted_dcp() -> None:
    listing = objs("ck/__0_0.distcp")
    (ref,) = discover(listing, locate)
    problems = {p.problem for p in check_adopted(ref, listing)}
    assert problems == {"uncommitted", "missing"}


def test_check_adopted_accepts_keys_relative_to_the_checkpoint() -> None:
    ref = CheckpointRef(ROOT + "ck/", "ck", None, Guarantee.DCP)
    assert check_adopted(ref, objs(".metadata", "__0_0.distcp")) == ()
    assert [p.problem for p in check_adopted(ref, objs("__0_0.distcp"))] == ["missing"]


# --------------------------------------------------------------------------- Megatron


def megatron(tracker_at: float, newest_iter_at: float) -> list[ObjectInfo]:
    return objs(
        ("latest_checkpointed_iteration.txt", 4, tracker_at),
        ("iter_0001000/mp_rank_00/model_optim_rng.pt", 10, 10.0),
        ("iter_0001000/mp_rank_01/model_optim_rng.pt", 10, 11.0),
        ("iter_0002000/mp_rank_00/model_optim_rng.pt", 10, newest_iter_at),
        ("iter_0002000/mp_rank_01/model_optim_rng.pt", 10, 20.0),
    )


def test_megatron_iteration_newer_than_the_tracker_is_not_committed() -> None:
    refs = by_name(discover(megatron(tracker_at=12.0, newest_iter_at=21.0), locate))
    assert {n: (r.guarantee, r.committed, r.step) for n, r in refs.items()} == {
        "iter_0001000": (Guarantee.MEGATRON, True, 1000),
        "iter_0002000": (Guarantee.MEGATRON, False, 2000),
    }
    refs = by_name(discover(megatron(tracker_at=22.0, newest_iter_at=21.0), locate))
    assert refs["iter_0002000"].committed


def test_megatron_tracker_text_is_exact_when_given() -> None:
    listing = megatron(tracker_at=22.0, newest_iter_at=21.0)  # times say committed; the text says 1000
    assert wanted_texts(listing) == ("latest_checkpointed_iteration.txt",)
    refs = by_name(discover(listing, locate, {"latest_checkpointed_iteration.txt": "1000\n"}))
    assert (refs["iter_0001000"].committed, refs["iter_0002000"].committed) == (True, False)
    # a tracker caught half-rewritten (empty) falls back to the times
    refs = by_name(discover(listing, locate, {"latest_checkpointed_iteration.txt": ""}))
    assert refs["iter_0002000"].committed


def test_megatron_without_times_trusts_all_but_the_newest() -> None:
    listing = [ObjectInfo(o.key, o.size) for o in megatron(0, 0)]
    refs = by_name(discover(listing, locate))
    assert (refs["iter_0001000"].committed, refs["iter_0002000"].committed) == (True, False)


def test_megatron_release_and_missing_tracker() -> None:
    refs = by_name(
        discover(
            objs("latest_checkpointed_iteration.txt", "release/mp_rank_00/model_optim_rng.pt"),
            locate,
            {"latest_checkpointed_iteration.txt": "release"},
        )
    )
    assert (refs["release"].guarantee, refs["release"].committed, refs["release"].step) == (
        Guarantee.MEGATRON,
        True,
        None,
    )
    (ref,) = discover(objs("iter_0000100/mp_rank_00/model_optim_rng.pt"), locate)
    assert (ref.guarantee, ref.committed) == (Guarantee.MEGATRON, False)


def test_megatron_torch_dist_iteration_is_megatron_not_dcp() -> None:
    listing = objs(
        ("latest_checkpointed_iteration.txt", 3, 50.0),
        "iter_0000100/.metadata",
        "iter_0000100/__0_0.distcp",
        "iter_0000100/common.pt",
        "iter_0000100/metadata.json",
    )
    (ref,) = discover(listing, locate)
    assert (ref.guarantee, ref.committed, ref.step) == (Guarantee.MEGATRON, False, 100)
    listing[0] = ObjectInfo("latest_checkpointed_iteration.txt", 3, modified_at=200.0)
    (ref,) = discover(listing, locate)
    assert ref.committed and check_adopted(ref, listing) == ()


def test_check_megatron_rank_files_and_grid() -> None:
    listing = objs(
        "latest_checkpointed_iteration.txt",
        "iter_0000100/mp_rank_00_000/model_optim_rng.pt",
        "iter_0000100/mp_rank_01_000/model_optim_rng.pt",
        "iter_0000100/mp_rank_00_001/model_optim_rng.pt",  # mp_rank_01_001 is absent
        ("iter_0000100/mp_rank_01_001/distrib_optim.pt", 10),
        ("iter_0000100/mp_rank_00_001/distrib_optim.pt", 10),
    )
    (ref,) = discover(listing, locate, {"latest_checkpointed_iteration.txt": "100"})
    problems = {(p.key, p.problem) for p in check_adopted(ref, listing)}
    assert problems == {("mp_rank_01_001/model_optim_rng.pt", "missing")}
    listing = objs(
        "latest_checkpointed_iteration.txt",
        "iter_0000100/mp_rank_00/model_optim_rng.pt",
        "iter_0000100/mp_rank_02/model_optim_rng.pt",
        ("iter_0000100/mp_rank_03/model_optim_rng.pt", 0),
    )
    (ref,) = discover(listing, locate, {"latest_checkpointed_iteration.txt": "100"})
    assert {(p.key, p.problem) for p in check_adopted(ref, listing)} == {
        ("mp_rank_01", "missing"),
        ("mp_rank_03/model_optim_rng.pt", "size"),
    }


# --------------------------------------------------------------------------- NeMo


def test_nemo_unfinished_marker_means_not_committed() -> None:
    listing = objs(
        "nemo/gpt--val_loss=2.10-step=1000-consumed_samples=8000.0/weights/.metadata",
        "nemo/gpt--val_loss=2.10-step=1000-consumed_samples=8000.0/weights/__0_0.distcp",
        "nemo/gpt--val_loss=2.10-step=1000-consumed_samples=8000.0/context/model.yaml",
        "nemo/gpt--val_loss=2.05-step=2000-consumed_samples=16000.0-last/weights/__0_0.distcp",
        "nemo/gpt--val_loss=2.05-step=2000-consumed_samples=16000.0-last-unfinished",
        "nemo/epoch=0-step=1500.ckpt",
        "nemo/epoch=0-step=1500-EMA.ckpt",
        "nemo/epoch=0-step=2500.ckpt",
        "nemo/epoch=0-step=2500-unfinished",
    )
    refs = discover(listing, locate)
    got = [(r.step, r.guarantee, r.committed) for r in refs]
    assert got == [
        (1000, Guarantee.NEMO, True),
        (1500, Guarantee.NEMO, True),
        (2000, Guarantee.NEMO, False),
        (2500, Guarantee.NEMO, False),
    ]
    assert refs[1].location == ROOT + "nemo/epoch=0-step=1500.ckpt"
    assert check_adopted(refs[0], listing) == ()
    assert check_adopted(refs[1], listing) == ()
    assert {p.problem for p in check_adopted(refs[2], listing)} == {"uncommitted", "missing"}


def test_check_nemo_catches_a_marker_that_appeared_after_discovery_and_an_empty_file() -> None:
    ref = CheckpointRef(ROOT + "nemo/m--step=5.ckpt", "m--step=5.ckpt", 5, Guarantee.NEMO, committed=True)
    listing = objs(("nemo/m--step=5.ckpt", 0), "nemo/m--step=5-unfinished")
    assert {(p.key, p.problem) for p in check_adopted(ref, listing)} == {
        ("m--step=5-unfinished", "uncommitted"),
        ("m--step=5.ckpt", "size"),
    }


# --------------------------------------------------------------------------- robustness


def test_manifest_refs_have_no_adopted_checks_but_torn_ones_say_so() -> None:
    listing = objs("step_1/ssv-manifest.json", "step_2/a")
    done, torn = discover(listing, locate)
    assert check_adopted(done, listing) == ()
    assert [p.problem for p in check_adopted(torn, listing)] == ["uncommitted"]


def test_empty_checkpoint_is_missing() -> None:
    ref = CheckpointRef(ROOT + "gone/", "gone", 3, Guarantee.DCP)
    assert [p.problem for p in check_adopted(ref, [])] == ["missing"]


KEY_PART = st.sampled_from(
    [
        "",
        ".",
        "..",
        "step_1",
        "iter_0000002",
        "ssv-manifest.json",
        ".metadata",
        "__0_0.distcp",
        "mp_rank_00",
        "model_optim_rng.pt",
        "latest_checkpointed_iteration.txt",
        "x-step=3-last",
        "x-step=3-last-unfinished",
        "-unfinished",
        "a.ckpt",
        "release",
        "0",
        "mp_rank_01_002",
    ]
) | st.text(max_size=12)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(KEY_PART, min_size=0, max_size=6),
            st.integers(min_value=0, max_value=10**12),
            st.none() | st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e10),
        ),
        max_size=30,
    ),
    st.dictionaries(st.text(max_size=30), st.text(max_size=10), max_size=3),
)
def test_discover_never_raises_and_does_not_depend_on_order(
    entries: list[tuple[list[str], int, float | None]], texts: dict[str, str]
) -> None:
    listing = [ObjectInfo("/".join(parts), size, modified_at=t) for parts, size, t in entries]
    refs = discover(listing, locate, texts)
    assert discover(list(reversed(listing)), locate, texts) == refs
    assert len({r.location for r in refs}) == len(refs)
    for ref in refs:
        assert ref.location.startswith(ROOT)
        check_adopted(ref, listing)


@pytest.mark.parametrize("n", [10_000])
def test_discover_scales_to_a_large_listing(n: int) -> None:
    listing = [
        ObjectInfo(f"step_{s:06d}/rank{r:05d}.pt", 1, modified_at=1.0) for s in range(10) for r in range(n // 10)
    ]
    listing += [ObjectInfo(f"step_{s:06d}/ssv-manifest.json", 1, modified_at=2.0) for s in range(9)]
    refs = discover(listing, locate)
    assert [r.committed for r in refs] == [True] * 9 + [False]
