"""The remediation ladder (domain/health/ladder.py) and the validation verdict
(domain/health/validation.py), on plain data: each rung's move, its actions and their records,
two failed validations to "needs repair" with one page, a person's return validated before use,
probation, and the verdict's reasons."""

from __future__ import annotations

import pytest

from supervisor.domain.health.ladder import (
    IllegalRung,
    LadderSettings,
    NodeCare,
    NodeSeen,
    Remedy,
    Rung,
    enter,
    first_remedy,
    kept_out,
    move,
    step,
)
from supervisor.domain.health.validation import ValidationFigures, ValidationSettings, judge

S = LadderSettings(max_failed_validations=2, reboot_timeout_s=600, validation_timeout_s=900, probation_s=86400)
V = ValidationSettings()
DRAINED = NodeSeen("n1", in_service=False, boot_time=1000.0)
BACK = NodeSeen("n1", in_service=True, boot_time=5000.0)  # rebooted: a later boot time, in service


def good(node: str = "n1") -> ValidationFigures:
    return ValidationFigures(node, burn=95.0, burn_expected=100.0, collective_gbps=9.0, peers_gbps=10.0, elapsed_s=42)


def slow_collective(node: str = "n1") -> ValidationFigures:
    return ValidationFigures(node, burn=95.0, burn_expected=100.0, collective_gbps=2.0, peers_gbps=10.0, elapsed_s=42)


def ops(result) -> list[str]:
    return [a.op.value for a in result.actions]


def done(result) -> NodeCare:
    """The record once every action of the step is done (the last one that changes it)."""
    records = [a.then for a in result.actions if a.then is not None]
    return records[-1] if records else result.care


def test_an_xid_79_is_reserved_rebooted_validated_and_resumed_on_probation():
    care = enter("n1", "XID 79: GPU has fallen off the bus (gpu 0)", "xid-79@1", 100.0).care
    assert care is not None and care.rung is Rung.DRAINED and first_remedy(care.rule) is Remedy.REBOOT
    reserve = step(care, DRAINED, None, S, 110.0)
    assert ops(reserve) == ["RESERVE"] and done(reserve).rung is Rung.RESERVED
    reboot = step(done(reserve), DRAINED, None, S, 120.0)
    assert ops(reboot) == ["REBOOT"] and done(reboot).boot_before == 1000.0
    assert step(done(reboot), DRAINED, None, S, 130.0).actions == ()  # not back yet
    same_boot = NodeSeen("n1", in_service=True, boot_time=1000.0)
    assert step(done(reboot), same_boot, None, S, 135.0).actions == ()  # in service, but no reboot seen
    validate = step(done(reboot), BACK, None, S, 140.0)
    assert ops(validate) == ["VALIDATE"] and done(validate).rung is Rung.VALIDATING
    assert step(done(validate), BACK, None, S, 150.0).actions == ()  # the job runs
    passed = step(done(validate), BACK, judge(good(), V), S, 200.0)
    assert ops(passed) == ["RESUME"]
    probation = done(passed)
    assert probation.rung is Rung.PROBATION and probation.until == 200.0 + 86400
    assert probation.evidence["burn"] == 95.0 and "validation passed in 42 s" in passed.notes[0].message
    assert step(probation, BACK, None, S, 300.0).care == probation
    over = step(probation, BACK, None, S, 200.0 + 86400)
    assert over.care is None and over.notes[0].rung == "healthy"


def test_two_failed_validations_need_repair_with_one_page():
    care = NodeCare("n1", Rung.VALIDATING, 100.0, "XID 79", "xid-79@1")
    first = step(care, BACK, judge(slow_collective(), V), S, 200.0)
    assert ops(first) == ["DRAIN", "REBOOT"] and done(first).rung is Rung.REBOOTING and done(first).failures == 1
    again = step(done(first), NodeSeen("n1", True, 9000.0), None, S, 300.0)
    assert ops(again) == ["VALIDATE"]
    second = step(done(again), BACK, judge(slow_collective(), V), S, 400.0)
    assert ops(second) == ["DRAIN", "UNRESERVE", "PAGE"]
    repair = done(second)
    assert repair.rung is Rung.NEEDS_REPAIR and repair.failures == 2
    assert "collective 2 GB/s below 70% of the peers' 10 GB/s" in second.notes[0].message
    assert step(repair, DRAINED, None, S, 500.0).actions == ()  # never used, no second page
    assert kept_out([repair], 2, S) == {"n1"}


def test_a_node_resumed_by_a_person_is_validated_before_use():
    repair = NodeCare("n1", Rung.NEEDS_REPAIR, 100.0, "XID 79", "xid-79@1", failures=2)
    resumed = step(repair, NodeSeen("n1", in_service=True, boot_time=1000.0), None, S, 200.0)
    assert ops(resumed) == ["RESERVE"] and done(resumed).rung is Rung.RESERVED and done(resumed).failures == 0
    validate = step(done(resumed), NodeSeen("n1", in_service=True, boot_time=1000.0), None, S, 210.0)
    assert ops(validate) == ["VALIDATE"]  # in service inside the reservation: no reboot needed
    drained = NodeCare("n2", Rung.DRAINED, 100.0, "XID 79", "xid-79@1")  # ours, resumed before its ladder ran
    busy = NodeSeen("n2", in_service=True, others_jobs=True)
    assert step(drained, busy, None, S, 200.0).actions == ()  # another user's job: not reserved under it


def test_hardware_faults_go_to_a_person_at_once():
    care = enter("n1", "XID 64: row remap failure", "xid-64@1", 100.0).care
    assert care is not None
    result = step(care, DRAINED, None, S, 110.0)
    assert ops(result) == ["UNRESERVE", "PAGE"] and done(result).rung is Rung.NEEDS_REPAIR


def test_a_reboot_that_does_not_come_back_and_a_silent_validation_fail():
    rebooting = NodeCare("n1", Rung.REBOOTING, 100.0, "XID 79", "xid-79@1", boot_before=1000.0)
    assert step(rebooting, DRAINED, None, S, 700.0).actions == ()
    late = step(rebooting, DRAINED, None, S, 701.0)
    assert ops(late) == ["UNRESERVE", "PAGE"] and "not back in service 600 s after its reboot" in late.notes[0].message
    validating = NodeCare("n1", Rung.VALIDATING, 100.0, "XID 79", "xid-79@1")
    silent = step(validating, BACK, None, S, 1001.0)
    assert ops(silent) == ["DRAIN", "REBOOT"] and "did not report within 900 s" in silent.actions[0].why


def test_probation_keeps_a_node_out_of_big_runs_only():
    probation = NodeCare("n1", Rung.PROBATION, 100.0, "XID 79", until=1e9)
    validating = NodeCare("n2", Rung.VALIDATING, 100.0, "XID 79")
    assert kept_out([probation, validating], 16, S) == {"n2"}
    assert kept_out([probation, validating], 17, S) == {"n1", "n2"}


def test_the_ladder_refuses_moves_it_does_not_make():
    with pytest.raises(IllegalRung):
        move(Rung.DRAINED, Rung.PROBATION)
    with pytest.raises(IllegalRung):
        enter("n1", "again", "xid-79@1", 100.0, earlier=NodeCare("n1", Rung.VALIDATING, 1.0, "x"))
    assert enter("n1", "again", "xid-79@1", 100.0, earlier=NodeCare("n1", Rung.PROBATION, 1.0, "x")).care


def test_action_keys_are_one_per_node_rung_and_time():
    care = NodeCare("n1", Rung.RESERVED, 120.0, "XID 79")
    first, again = step(care, DRAINED, None, S, 130.0), step(care, DRAINED, None, S, 140.0)
    assert first.actions[0].key == again.actions[0].key == "n1:reboot:reserved:120"


@pytest.mark.parametrize(
    ("figures", "reason"),
    [
        (ValidationFigures("n1", oneshot=("xid-79@1: XID 79",), burn=95, burn_expected=100, collective_gbps=9, peers_gbps=10), "one-shot check: xid-79@1"),
        (ValidationFigures("n1", burn=50, burn_expected=100, collective_gbps=9, peers_gbps=10), "burn-in 50 below 80%"),
        (ValidationFigures("n1", collective_gbps=9, peers_gbps=10, errors={"burn": "killed"}), "burn-in not measured: killed"),
        (ValidationFigures("n1", burn=95, burn_expected=100, errors={"collective": "no peer"}), "collective not measured: no peer"),
        (ValidationFigures("n1", burn=95, burn_expected=100, dcgm="Fail", collective_gbps=9, peers_gbps=10), "dcgmi diag -r 2: Fail"),
    ],
)  # fmt: skip
def test_each_check_fails_the_validation_with_its_reason(figures, reason):
    verdict = judge(figures, V)
    assert not verdict.passed and any(r.startswith(reason) for r in verdict.reasons), verdict.reasons


def test_a_collective_without_a_peer_may_be_waived_and_says_so():
    lone = ValidationFigures("n1", burn=95, burn_expected=100, errors={"collective": "no known-good peer free"})
    verdict = judge(lone, ValidationSettings(collective_required=False))
    assert verdict.passed and verdict.reasons == (
        "collective waived (collective_required = false): no known-good peer free",
    )
    with pytest.raises(ValueError, match="burn_min_share"):
        ValidationSettings(burn_min_share=1.5)
