"""Rollback's public contract on plain data: which checkpoint, which batches to skip, when a second
spike escalates (near: within 2,000 steps of an earlier onset, by default), when a human decides,
and the record read back."""

import dataclasses

import pytest

from supervisor.domain.spikes.events import Peak, SpikeEvent, SpikeKind, SpikeSettings, SpikeStatus, outcome
from supervisor.domain.spikes.rollback import (
    PastRollback,
    RollbackPolicy,
    RollbackRecord,
    RollbackStatus,
    SkipRange,
    choose_rollback,
    decide_rollback,
    pending_rollback,
    plan_rollback,
    skip_ranges,
    suggest_skip,
)

S = SpikeSettings()  # min_steps_before 100, skip_batches 300, skip_past_onset 50
CKPTS = (1000, 2000, 3000, 4000, 5000)


def spike(onset=5050, status=SpikeStatus.NOT_HEALED):
    event = SpikeEvent(SpikeKind.LOSS, onset, 9.0, 2.0, 0.1, 70.0, "loss jumped")
    return outcome(event, status, "heal-window", onset + 200, Peak(onset + 5, 9.5, 75.0), "did not heal")


def test_defaults_of_the_policy():
    p = RollbackPolicy()
    assert (p.max_rollbacks, p.window_s, p.near_steps, p.skip_growth, p.lr_scale_first, p.lr_scale_repeat) == (
        3,
        86400.0,
        2000,
        2.0,
        1.0,
        0.5,
    )


def test_choose_rollback_takes_the_newest_checkpoint_far_enough_before_the_onset():
    assert choose_rollback(5050, CKPTS, 100) == 4000
    assert choose_rollback(5100, list(reversed(CKPTS)), 100) == 5000  # exactly min_steps_before
    assert choose_rollback(5099, CKPTS, 100) == 4000
    assert choose_rollback(1099, CKPTS, 100) is None
    assert choose_rollback(5000, (), 0) is None


def test_suggest_skip_covers_skip_batches_and_reaches_past_the_onset():
    assert suggest_skip(4000, 4100, S) == SkipRange(4001, 4300)
    assert suggest_skip(4000, 4500, S) == SkipRange(4001, 4550)  # extended past the onset
    assert suggest_skip(4000, 3000, SpikeSettings(skip_batches=0, skip_past_onset=0)) == SkipRange(4001, 4001)
    assert SkipRange(4001, 4300).batches == 300 and SkipRange(4001, 4300).as_megatron() == "4001-4300"


def test_plan_rollback_only_for_a_rollback_decision_with_a_checkpoint():
    plan = plan_rollback(spike(), CKPTS, S)
    assert (plan.checkpoint_step, plan.skip) == (4000, SkipRange(4001, 5100))
    assert plan.reason == (
        "restart from verified checkpoint 4000 (newest at least 100 steps before onset 5050); "
        "skip iterations 4001-5100 (1100 batches)"
    )
    assert plan_rollback(spike(status=SpikeStatus.HEALED), CKPTS, S) is None
    assert plan_rollback(spike(onset=1050), CKPTS, S) is None


def test_a_first_rollback_is_plain():
    action = decide_rollback(spike(), CKPTS, [], now=1e6, settings=S)
    assert not action.page and (action.escalation, action.lr_scale) == (0, 1.0)
    assert action.plan.skip == SkipRange(4001, 5100)
    assert action.reason == action.plan.reason


def test_near_is_within_two_thousand_steps_of_an_earlier_onset():
    onset = 6000  # checkpoint 5000, skip 5001-6050 by default
    for distance, escalation in ((2000, 1), (-2000, 1), (2001, 0), (-2001, 0), (0, 1)):
        history = [PastRollback(onset + distance, at=900.0)]
        action = decide_rollback(spike(onset), CKPTS, history, now=1000.0, settings=S)
        assert action.escalation == escalation, distance
    fresh = decide_rollback(spike(onset), CKPTS, [PastRollback(onset + 2001, 900.0)], now=1000.0, settings=S)
    assert (fresh.lr_scale, fresh.plan.skip) == (1.0, SkipRange(5001, 6050))
    assert fresh.reason == fresh.plan.reason


def test_each_escalation_doubles_the_skip_and_halves_the_lr():
    settings = SpikeSettings(skip_past_onset=0)
    history = [PastRollback(5100, 900.0), PastRollback(5200, 950.0)]
    action = decide_rollback(spike(5300), CKPTS, history, now=1000.0, settings=settings)
    assert (action.escalation, action.lr_scale) == (2, 0.25)
    assert action.plan.skip == SkipRange(5001, 5000 + 300 * 4)
    assert action.reason.endswith("; repeat 2 near step 5300: skip ×4, LR ×0.25")
    one = decide_rollback(spike(5300), CKPTS, history[:1], now=1000.0, settings=settings)
    assert one.plan.skip == SkipRange(5001, 5600) and one.reason.endswith("; repeat 1 near step 5300: skip ×2, LR ×0.5")


def test_policy_settings_are_honoured():
    policy = RollbackPolicy(near_steps=10, skip_growth=3.0, lr_scale_first=0.8, lr_scale_repeat=0.5)
    first = decide_rollback(spike(6000), CKPTS, [], now=1000.0, settings=S, policy=policy)
    assert first.lr_scale == 0.8 and first.reason.endswith("; LR ×0.8")
    no_past = SpikeSettings(skip_past_onset=0)
    again = decide_rollback(
        spike(5400), CKPTS, [PastRollback(5410, 990.0)], now=1000.0, settings=no_past, policy=policy
    )
    assert (again.escalation, again.lr_scale) == (1, 0.4)
    assert again.plan.skip == SkipRange(5001, 5900)  # 300 × 3
    far = decide_rollback(spike(5400), CKPTS, [PastRollback(5411, 990.0)], now=1000.0, settings=S, policy=policy)
    assert far.escalation == 0


def test_rollbacks_older_than_the_window_do_not_count():
    old = [PastRollback(6000, at=1000.0)]
    assert decide_rollback(spike(6000), CKPTS, old, now=1000.0 + 86400.0, settings=S).escalation == 1
    assert decide_rollback(spike(6000), CKPTS, old, now=1000.0 + 86400.5, settings=S).escalation == 0


def test_too_many_rollbacks_in_the_window_page_a_human():
    history = [PastRollback(100 * i, at=500.0 + i) for i in range(3)]
    action = decide_rollback(spike(6000), CKPTS, history, now=1000.0, settings=S)
    assert action.page and action.plan is None
    assert (action.escalation, action.lr_scale) == (3, 1.0)
    assert action.reason == (
        "3 automatic rollbacks in the last 24 h (limit 3); not rolling back again by itself: a human decides"
    )
    assert not decide_rollback(spike(6000), CKPTS, history[:2], now=1000.0, settings=S).page
    two = RollbackPolicy(max_rollbacks=2, window_s=7200.0)
    assert decide_rollback(spike(6000), CKPTS, history[:2], now=1000.0, settings=S, policy=two).reason.startswith(
        "2 automatic rollbacks in the last 2 h (limit 2)"
    )


def test_no_checkpoint_old_enough_pages_a_human():
    action = decide_rollback(spike(1050), CKPTS, [PastRollback(1000, 900.0)], now=1000.0, settings=S)
    assert action.page and (action.escalation, action.lr_scale) == (1, 0.5)
    assert action.reason == "no verified checkpoint at least 100 steps before the onset at step 1050; a human decides"


def record(status=RollbackStatus.PLANNED, attempt=0, skip=SkipRange(4001, 4300), reason="why", **kw):
    return RollbackRecord("r", attempt, 4100, status, 10.0, reason, 4000, skip, **kw)


def test_the_record_round_trips_and_reads_old_documents():
    r = record(lr_scale=0.5, escalation=1)
    assert r.to_json() == {
        "run": "r",
        "attempt": 0,
        "onset_step": 4100,
        "status": "planned",
        "at": 10.0,
        "reason": "why",
        "checkpoint_step": 4000,
        "skip": [4001, 4300],
        "lr_scale": 0.5,
        "escalation": 1,
    }
    assert RollbackRecord.from_json(r.to_json()) == r
    old = RollbackRecord.from_json({"run": "r", "attempt": "1", "onset_step": 5, "status": "blocked", "at": 1})
    assert (old.reason, old.checkpoint_step, old.skip, old.lr_scale, old.escalation) == ("", None, None, 1.0, 0)
    assert r.past() == PastRollback(4100, 10.0, 0.5)


def test_blocked_rollbacks_do_not_count_nor_hand_on_a_skip():
    history = [record(RollbackStatus.DONE), record(RollbackStatus.BLOCKED, skip=SkipRange(1, 2)), record(skip=None)]
    assert [h.counts for h in history] == [True, False, True]
    assert skip_ranges(history) == "4001-4300"
    assert skip_ranges([record(), record(RollbackStatus.DONE, skip=SkipRange(5001, 5300))]) == "4001-4300,5001-5300"
    assert skip_ranges([]) == ""


def test_the_pending_rollback_is_the_last_planned_one_of_the_attempt():
    a, b = record(reason="a"), record(reason="b")
    assert pending_rollback([a, b, record(RollbackStatus.DONE)], 0) == RollbackRecord(
        "r", 0, 4100, RollbackStatus.PLANNED, 10.0, "b", 4000, SkipRange(4001, 4300)
    )
    assert pending_rollback([a, record(attempt=1)], 1).attempt == 1
    assert pending_rollback([record(RollbackStatus.DONE)], 0) is None
    assert pending_rollback([a], None) is None


def test_plans_policies_and_records_are_immutable_values():
    action = decide_rollback(spike(), CKPTS, [], now=1e6, settings=S)
    for value in (action, action.plan, action.plan.skip, RollbackPolicy(), PastRollback(1, 2.0), record()):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.reason = "changed"  # type: ignore[misc]


def test_a_past_rollback_defaults_to_an_unchanged_lr():
    assert PastRollback(1, 2.0).lr_scale == 1.0


def test_more_rollbacks_than_the_limit_still_page():
    history = [PastRollback(100 * i, at=500.0 + i) for i in range(4)]
    action = decide_rollback(spike(6000), CKPTS, history, now=1000.0, settings=S)
    assert action.page and action.escalation == 4


def test_a_raised_first_lr_is_named_too():
    policy = RollbackPolicy(lr_scale_first=1.5)
    assert decide_rollback(spike(6000), CKPTS, [], now=1000.0, settings=S, policy=policy).reason.endswith("; LR ×1.5")


def test_record_defaults():
    r = RollbackRecord("r", 0, 1, RollbackStatus.BLOCKED, 0.0, "why")
    assert (r.checkpoint_step, r.skip, r.lr_scale, r.escalation) == (None, None, 1.0, 0)
