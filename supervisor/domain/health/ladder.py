"""The remediation ladder of one node the supervisor drained: hold it apart, reboot it through Slurm,
validate it, give it back on probation — or "needs repair" for a person, with one page. Pure.

The rungs (``Rung``) and the moves between them (``TRANSITIONS``; any other raises
``IllegalRung``)::

    drained ──RESERVE──▶ reserved ──REBOOT──▶ rebooting ──(new boot time)──▶ validating
       │                    │ (in service: a person or ReturnToService resumed it)  │
       │                    └──────────────────────────────────────────────────────▶│
       │                        pass: RESUME ──▶ probation ──(probation_s)──▶ healthy (no record)
       │                        fail once: DRAIN + REBOOT ──▶ rebooting (the next rung)
       └──(hardware)──▶ needs-repair ◀── fail twice, a reboot that does not come back, no time left
                          │ a person returns the node to service: RESERVE ──▶ reserved (validated first)

The guard (``guard/remedy.py``) grants each remedy only for a node this account drained and holds
in its maintenance reservation, so the ladder can only touch its own nodes. ``step`` reads the
node's current record and what Slurm shows of it (``NodeSeen``), and returns the actions to take
(``CareAction``), each with the record to keep once it is done (``then``), and the logbook notes
with their evidence (``CareNote``). The engine stores the record (the ``node_care`` table), so a
restarted daemon resumes each node's ladder where it stood.

Which first remedy a fault gets (``first_remedy``), from the XID catalogue's recovery actions and
the finding's rule: a row-remap failure (XID 64) is hardware, for a person at once; every other
fatal fault is rebooted first (off the bus, DBE and uncontained ECC, GSP, NVLink, a recovery
action asking for a reset or a reboot, a GPU missing, a node gone silent). A GPU reset where the
node is idle and the GPU allows it is not a rung yet (docs/node-health.md says why).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from supervisor.domain.health.validation import ValidationVerdict


class Rung(StrEnum):
    DRAINED = "drained"  # out of service with evidence: the ladder starts
    RESERVED = "reserved"  # in the account's maintenance reservation (guard RESERVE)
    REBOOTING = "rebooting"  # reboot asked through Slurm (guard REBOOT), waiting for a later boot time
    VALIDATING = "validating"  # in service inside the reservation: the validation job's turn
    PROBATION = "probation"  # passed and resumed: usable by small runs and as a spare until ``until``
    NEEDS_REPAIR = "needs-repair"  # for a person: never used until a person returns it


TRANSITIONS: Mapping[Rung, frozenset[Rung]] = MappingProxyType(
    {
        Rung.DRAINED: frozenset({Rung.RESERVED, Rung.NEEDS_REPAIR}),
        Rung.RESERVED: frozenset({Rung.REBOOTING, Rung.VALIDATING, Rung.NEEDS_REPAIR}),
        Rung.REBOOTING: frozenset({Rung.VALIDATING, Rung.NEEDS_REPAIR}),
        Rung.VALIDATING: frozenset({Rung.PROBATION, Rung.REBOOTING, Rung.NEEDS_REPAIR}),
        Rung.PROBATION: frozenset({Rung.DRAINED}),  # faulted again while on probation
        Rung.NEEDS_REPAIR: frozenset({Rung.RESERVED}),  # a person returned it: validated before use
    }
)


class IllegalRung(ValueError):
    """A move the ladder does not make (a bug, or a record edited by hand)."""


class Remedy(StrEnum):
    REBOOT = "reboot"
    REPAIR = "repair"  # hardware: a person


class CareOp(StrEnum):
    RESERVE = "RESERVE"  # guard
    REBOOT = "REBOOT"  # guard
    VALIDATE = "VALIDATE"  # the validation job, submitted into the reservation
    RESUME = "RESUME"  # guard: back to every user, the reservation removed
    DRAIN = "DRAIN"  # guard (own-remedy: the node is in the reservation)
    UNRESERVE = "UNRESERVE"  # guard
    PAGE = "PAGE"  # the site's admins (once per needs-repair)


HARDWARE_RULES = frozenset({"xid-64", "row-remap-failed"})  # the XID catalogue's "hardware / RMA"


@dataclass(frozen=True)
class LadderSettings:
    max_failed_validations: int = 2
    reboot_timeout_s: float = 900.0  # a rebooted node not back in service by then needs repair
    validation_timeout_s: float = 1200.0  # the validation job's time limit plus the wait to start
    probation_s: float = 3 * 86400.0
    probation_max_nodes: int = 16  # runs over this many nodes keep probation nodes out

    def __post_init__(self) -> None:
        if self.max_failed_validations < 1:
            raise ValueError(f"max_failed_validations must be at least 1 (got {self.max_failed_validations})")


@dataclass(frozen=True)
class NodeCare:
    """One node's place on the ladder: what the store keeps (``node_care``)."""

    node: str
    rung: Rung
    since: float  # when the node reached this rung
    cause: str  # the fault that started the ladder, for the logbook and the Slurm reasons
    rule: str = ""  # the finding's rule ("xid-79@1")
    failures: int = 0  # failed validations on this ladder
    boot_before: float | None = None  # the boot time Slurm showed when the reboot was asked
    until: float | None = None  # probation's end
    evidence: Mapping[str, Any] = field(default_factory=dict)  # the last rung's figures


@dataclass(frozen=True)
class NodeSeen:
    """What Slurm shows of the node this tick."""

    node: str
    in_service: bool  # responding, neither drained nor down
    boot_time: float | None = None
    others_jobs: bool = False  # a job of another user holds the node (the guard would refuse RESERVE)


@dataclass(frozen=True)
class CareAction:
    op: CareOp
    node: str
    why: str
    key: str  # idempotency key: one action per node, rung and time it was reached
    then: NodeCare | None  # the record once the action is done (None: no change)


@dataclass(frozen=True)
class CareNote:
    """A logbook line for one move, with its evidence."""

    node: str
    rung: str  # the rung reached ("healthy" when the node leaves the ladder)
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CareStep:
    care: NodeCare | None  # the record after this step without any action (None: left the ladder)
    actions: tuple[CareAction, ...] = ()
    notes: tuple[CareNote, ...] = ()


def first_remedy(rule: str) -> Remedy:
    return Remedy.REPAIR if rule.split("@", 1)[0] in HARDWARE_RULES else Remedy.REBOOT


def enter(node: str, cause: str, rule: str, now: float, earlier: NodeCare | None = None) -> CareStep:
    """A node the supervisor drained starts the ladder (again, when it faulted on probation)."""
    if earlier is not None:
        move(earlier.rung, Rung.DRAINED)
    care = NodeCare(node, Rung.DRAINED, now, cause, rule)
    note = CareNote(node, Rung.DRAINED, f"{node} drained: {cause}; remedy: {first_remedy(rule)}", {"rule": rule})
    return CareStep(care, notes=(note,))


def move(old: Rung, new: Rung) -> Rung:
    if new not in TRANSITIONS[old]:
        raise IllegalRung(f"the ladder does not go from {old} to {new}")
    return new


def step(care: NodeCare, seen: NodeSeen, verdict: ValidationVerdict | None, s: LadderSettings, now: float) -> CareStep:
    """The next move of one node; ``verdict``: the validation job's, once it reported."""
    by_rung = {
        Rung.DRAINED: _drained,
        Rung.RESERVED: _reserved,
        Rung.REBOOTING: _rebooting,
        Rung.NEEDS_REPAIR: _needs_repair,
    }
    if care.rung is Rung.VALIDATING:
        return _validating(care, seen, verdict, s, now)
    if care.rung is Rung.PROBATION:
        return _probation(care, now)
    return by_rung[care.rung](care, seen, s, now)


def _to(care: NodeCare, rung: Rung, now: float, **changes: Any) -> NodeCare:
    return replace(care, rung=move(care.rung, rung), since=now, **changes)


def _act(op: CareOp, care: NodeCare, why: str, then: NodeCare | None) -> CareAction:
    return CareAction(op, care.node, why, f"{care.node}:{op.value.lower()}:{care.rung}:{care.since:.0f}", then)


def _drained(care: NodeCare, seen: NodeSeen, s: LadderSettings, now: float) -> CareStep:
    if first_remedy(care.rule) is Remedy.REPAIR:
        return _repair(care, f"{care.cause}: hardware (the XID catalogue's RMA class), no reboot helps", now)
    if seen.others_jobs:  # someone returned it and another user's job runs there: wait for it to end
        return CareStep(care)
    then = _to(care, Rung.RESERVED, now)
    why = "held apart in a maintenance reservation before its remedy"
    return CareStep(care, (_act(CareOp.RESERVE, care, why, then),), (CareNote(care.node, Rung.RESERVED, why),))


def _reserved(care: NodeCare, seen: NodeSeen, s: LadderSettings, now: float) -> CareStep:
    if seen.in_service:  # resumed by a person or ReturnToService: validated before use
        return _validate(care, now, "in service inside the reservation: validation before use")
    return _reboot(care, seen, now, f"reboot through Slurm for {care.cause}")


def _reboot(care: NodeCare, seen: NodeSeen, now: float, why: str) -> CareStep:
    then = _to(care, Rung.REBOOTING, now, boot_before=seen.boot_time)
    note = CareNote(care.node, Rung.REBOOTING, why, {"boot_time": seen.boot_time})
    return CareStep(care, (_act(CareOp.REBOOT, care, why, then),), (note,))


def _rebooting(care: NodeCare, seen: NodeSeen, s: LadderSettings, now: float) -> CareStep:
    booted = seen.boot_time is not None and (care.boot_before is None or seen.boot_time > care.boot_before)
    if booted and seen.in_service:
        return _validate(care, now, f"rebooted (boot time {care.boot_before} -> {seen.boot_time})")
    if now - care.since > s.reboot_timeout_s:
        return _repair(care, f"not back in service {s.reboot_timeout_s:.0f} s after its reboot", now)
    return CareStep(care)


def _validate(care: NodeCare, now: float, why: str) -> CareStep:
    then = _to(care, Rung.VALIDATING, now)
    evidence = {"failures": care.failures}
    return CareStep(
        care, (_act(CareOp.VALIDATE, care, why, then),), (CareNote(care.node, Rung.VALIDATING, why, evidence),)
    )


def _validating(
    care: NodeCare, seen: NodeSeen, verdict: ValidationVerdict | None, s: LadderSettings, now: float
) -> CareStep:
    if verdict is None:
        if now - care.since <= s.validation_timeout_s:
            return CareStep(care)
        return _failed(care, seen, f"the validation did not report within {s.validation_timeout_s:.0f} s", {}, s, now)
    evidence = verdict.figures.to_json()
    if not verdict.passed:
        return _failed(care, seen, verdict.summary(), evidence, s, now)
    until = now + s.probation_s
    then = _to(care, Rung.PROBATION, now, until=until, evidence=evidence)
    message = f"{verdict.summary()}; resumed, on probation until {until:.0f}"
    return CareStep(
        care, (_act(CareOp.RESUME, care, message, then),), (CareNote(care.node, Rung.PROBATION, message, evidence),)
    )


def _failed(
    care: NodeCare, seen: NodeSeen, why: str, evidence: Mapping[str, Any], s: LadderSettings, now: float
) -> CareStep:
    failures = care.failures + 1
    failed = replace(care, failures=failures, evidence=evidence)
    drain = _act(CareOp.DRAIN, failed, f"validation failed ({failures} of {s.max_failed_validations}): {why}", None)
    if failures >= s.max_failed_validations:
        repair = _repair(failed, f"validation failed {failures} times, last: {why}", now)
        return CareStep(repair.care, (drain, *repair.actions), repair.notes)
    rebooted = _reboot(failed, seen, now, f"validation failed ({why}): the next rung, reboot")
    return CareStep(failed, (drain, *rebooted.actions), rebooted.notes)


def _repair(care: NodeCare, why: str, now: float) -> CareStep:
    """Needs repair: out of the reservation (left drained), one page."""
    then = _to(care, Rung.NEEDS_REPAIR, now)
    message = f"{care.node} needs repair: {why}"
    actions = (
        _act(CareOp.UNRESERVE, care, message, None),
        _act(CareOp.PAGE, care, message, then),
    )
    return CareStep(care, actions, (CareNote(care.node, Rung.NEEDS_REPAIR, message, dict(care.evidence)),))


def _needs_repair(care: NodeCare, seen: NodeSeen, s: LadderSettings, now: float) -> CareStep:
    if not seen.in_service or seen.others_jobs:
        return CareStep(care)
    then = _to(care, Rung.RESERVED, now, failures=0)
    why = f"{care.node} returned to service by a person: validated before any supervised run uses it"
    return CareStep(care, (_act(CareOp.RESERVE, care, why, then),), (CareNote(care.node, Rung.RESERVED, why),))


def _probation(care: NodeCare, now: float) -> CareStep:
    if care.until is not None and now < care.until:
        return CareStep(care)
    return CareStep(None, notes=(CareNote(care.node, "healthy", f"{care.node}'s probation is over"),))


def kept_out(cares: Iterable[NodeCare], run_nodes: int, s: LadderSettings) -> frozenset[str]:
    """The nodes a run of ``run_nodes`` nodes may not use: every node on the ladder, and one on
    probation too when the run is over ``probation_max_nodes`` (a repeat fault there costs the most)."""
    big = run_nodes > s.probation_max_nodes
    return frozenset(c.node for c in cares if c.rung is not Rung.PROBATION or big)
