"""The resume choice on plain data (``checkpoints.choose_resume`` and its helpers): the newest
verified checkpoint whatever order storage lists them in, fallbacks newest first, and why each
newer one was passed over."""

import pytest

from supervisor.domain.checkpoints.manifest import (
    CheckpointRef,
    Guarantee,
    Level,
    Outcome,
    VerifyResult,
    choose_resume,
    effective_result,
    staleness,
)


def ref(step, committed=True, guarantee=Guarantee.MANIFEST):
    return CheckpointRef(f"s3://b/ck/step_{step}/", f"step_{step}", step, guarantee, committed)


def ok(r, level=Level.METADATA):
    return VerifyResult(r.location, r.step, level, Outcome.VERIFIED, "ok")


def bad(r, outcome=Outcome.CORRUPT, level=Level.FULL):
    return VerifyResult(r.location, r.step, level, outcome, "shard 3 checksum")


def results(*pairs):
    return {res.location: res for res in pairs}


R = {s: ref(s) for s in (100, 200, 300, 400)}


def test_newest_verified_wins_whatever_the_input_order():
    shuffled = [R[200], R[400], R[100], R[300]]
    choice = choose_resume(shuffled, results(*(ok(r) for r in R.values())))
    assert choice.chosen == R[400]
    assert choice.fallbacks == (R[300], R[200], R[100])
    assert choice.skipped == ()
    assert choice.reason == "step 400: metadata-verified"


def test_newer_unusable_ones_are_skipped_with_why_newest_first():
    torn = ref(500, committed=False)
    res = results(ok(R[100]), ok(R[200]), bad(R[300]), bad(R[400], Outcome.UNVERIFIABLE, Level.METADATA))
    choice = choose_resume([R[100], torn, R[300], R[200], R[400]], res)
    assert choice.chosen == R[200] and choice.fallbacks == (R[100],)
    assert [(c.step, why) for c, why in choice.skipped] == [
        (500, "no commit marker (torn or still uploading)"),
        (400, "metadata verification: unverifiable: shard 3 checksum"),
        (300, "full verification: corrupt: shard 3 checksum"),
    ]
    assert choice.reason == "step 200: metadata-verified; skipped 3 newer"


def test_unverified_is_passed_over_and_older_bad_ones_are_not_listed():
    res = results(ok(R[200]), bad(R[100]))
    choice = choose_resume([R[100], R[200], R[300]], res)
    assert choice.chosen == R[200]
    assert choice.fallbacks == ()
    assert choice.skipped == ((R[300], "not verified yet"),)


def test_nothing_verified():
    choice = choose_resume([R[100], R[200]], results(bad(R[100])))
    assert choice.chosen is None and choice.fallbacks == ()
    assert [c.step for c, _ in choice.skipped] == [200, 100]
    assert choice.reason == "no verified checkpoint"
    assert choose_resume([], {}).reason == "no verified checkpoint"


def test_checkpoints_without_a_step_are_ignored():
    nameless = CheckpointRef("s3://b/ck/x/", "x", None, Guarantee.MANIFEST)
    choice = choose_resume([nameless, R[100]], results(ok(nameless), ok(R[100])))
    assert choice.chosen == R[100] and choice.skipped == () and choice.fallbacks == ()


def test_step_zero_sorts_below_step_one():
    zero, one = ref(0), ref(1)
    assert choose_resume([zero, one], results(ok(zero), ok(one))).chosen == one
    assert choose_resume([zero, one], results(ok(zero), ok(one))).fallbacks == (zero,)


def test_step_zero_is_a_checkpoint():
    zero = ref(0)
    choice = choose_resume([R[100], zero], results(ok(zero), bad(R[100])))
    assert choice.chosen == zero
    assert choose_resume([zero], results(ok(zero)), before_step=0).chosen == zero
    assert choose_resume([zero], results(ok(zero)), before_step=-1).chosen is None


def test_rollback_takes_the_newest_at_or_before_the_step():
    res = results(*(ok(r) for r in R.values()))
    choice = choose_resume(list(R.values()), res, before_step=300)
    assert choice.chosen == R[300] and choice.fallbacks == (R[200], R[100])
    assert choice.skipped == ()  # newer ones beyond the rollback point are not "skipped"
    assert choose_resume(list(R.values()), res, before_step=299).chosen == R[200]
    none = choose_resume(list(R.values()), res, before_step=50)
    assert none.chosen is None and none.reason == "no verified checkpoint at or before step 50"


@pytest.mark.parametrize("guarantee", [Guarantee.DCP, Guarantee.MEGATRON, Guarantee.NEMO])
def test_weak_layouts_are_labelled_and_refused_when_the_policy_says_so(guarantee):
    weak = ref(300, guarantee=guarantee)
    res = results(ok(weak, Level.FULL), ok(R[200]))
    allowed = choose_resume([weak, R[200]], res)
    assert allowed.chosen == weak
    assert allowed.reason == f"step 300: full-verified; {guarantee.describe}"
    refused = choose_resume([weak, R[200]], res, allow_weak=False)
    assert refused.chosen == R[200]
    assert refused.skipped == ((weak, f"{guarantee.value} layouts are not allowed by the run's policy"),)
    assert refused.reason == "step 200: metadata-verified; skipped 1 newer"


def test_effective_result_prefers_a_full_verdict_but_not_an_unverifiable_one():
    meta, full = ok(R[100]), bad(R[100])
    unverifiable = bad(R[100], Outcome.UNVERIFIABLE)
    assert effective_result(meta, full) is full
    assert effective_result(meta, unverifiable) is meta
    assert effective_result(None, unverifiable) is unverifiable
    assert effective_result(meta, None) is meta
    assert effective_result(None, None) is None
    assert effective_result(None, full) is full
    verified = ok(R[100], Level.FULL)
    assert effective_result(bad(R[100], level=Level.METADATA), verified) is verified


def test_staleness_counts_from_the_newer_of_the_stretch_start_and_the_last_verified():
    # expected every 100 s, alarm past 3 intervals
    assert staleness(1000.0, 0.0, None, 100.0, 3) == 1000.0
    assert staleness(1000.0, 0.0, 800.0, 100.0, 3) is None
    assert staleness(1000.0, 0.0, 600.0, 100.0, 3) == 400.0
    assert staleness(1000.0, 700.0, 100.0, 100.0, 3) is None  # a new stretch began at 700
    assert staleness(1000.0, 600.0, 100.0, 100.0, 3) == 400.0
    assert staleness(1000.0, 700.0, None, 100.0, 3) is None  # exactly 3 intervals: not yet
    assert staleness(1001.0, 700.0, None, 100.0, 3) == 301.0
    assert staleness(1000.0, 0.0, None, None, 3) is None
    assert staleness(1000.0, 0.0, None, 0.0, 3) is None
