"""The guard's decision on a remedy: RESERVE, REBOOT, UNRESERVE, and RESUME from a caller who is
not an admin. Pure, as ``policy.decide``, which answers every other request.

A remedy is for a node this account took out of service itself (the ``own-remedy`` rule), read
from the guard's own records, never from the request:

* RESERVE (a maintenance reservation of the node for the caller): the node's latest DOWN or DRAIN
  through the guard was the caller's, less than ``REMEDY_WINDOW_S`` ago, and no admin resumed or
  cleared it since; no job of another user holds the node (Slurm read at the moment of the request).
  The window: a node an admin returned with a plain ``scontrol`` months ago is no longer the
  caller's to hold apart.
* REBOOT, RESUME, UNRESERVE: the node is in the caller's live maintenance reservation (made by a
  RESERVE of the caller). So a node a caller reboots comes back into its reservation (``nextstate=
  RESUME`` into a reservation only the caller's jobs may use), and a RESUME returns to every user
  only a node the caller has held apart since its own drain, to validate it.

Otherwise ``not-own-remedy``. Admins may do each of them (``admin``), on any node.
"""

from __future__ import annotations

from dataclasses import replace

from supervisor.domain.observation import account_label, node_reason
from supervisor.guard.policy import (
    Caller,
    Facts,
    Limits,
    Op,
    Request,
    Verdict,
    clean_cause,
    decide,
    holds,
    in_own_reservation,
    problem,
)

REMEDIES = frozenset({Op.RESERVE, Op.REBOOT, Op.UNRESERVE})
RESERVATION_PREFIX = "ssv-maint-"
REMEDY_WINDOW_S = 7 * 86400.0  # how long after its own drain an account may still reserve the node
REBOOT_NEXT_STATE = "RESUME"  # into the caller's reservation: only its validation job may use the node


def is_remedy(caller: Caller, req: Request, limits: Limits) -> bool:
    """Decided here rather than by ``policy.decide``: the remedies, and a non-admin's RESUME."""
    return req.op in REMEDIES or (req.op == Op.RESUME and not caller.admin(limits.admin_groups))


def decide_request(caller: Caller, req: Request, facts: Facts, limits: Limits) -> Verdict:
    """Every request's decision: a remedy's here, the rest ``policy.decide``'s."""
    if not is_remedy(caller, req, limits):
        return decide(caller, req, facts, limits)
    invalid = problem(req)
    if invalid:
        return Verdict(False, "bad-request", invalid)
    if caller.admin(limits.admin_groups):
        return Verdict(True, "admin", f"{caller.name} is an admin", reason=remedy_reason(caller, req))
    verdict = _own_reservation(caller, req, facts) if req.op != Op.RESERVE else _own_drain(caller, req, facts)
    return replace(verdict, reason=remedy_reason(caller, req)) if verdict.granted else verdict


def _own_drain(caller: Caller, req: Request, facts: Facts) -> Verdict:
    drain = facts.own_drain
    if drain is None or drain.uid != caller.uid:
        by = "nobody through the guard" if drain is None else f"uid {drain.uid}"
        why = f"{req.node} was last taken out of service by {by}, not by {caller.name}: a remedy is for your own drain"
        return Verdict(False, "not-own-remedy", why)
    if facts.now - drain.at > REMEDY_WINDOW_S:
        why = f"{req.node} was drained by {caller.name} more than {REMEDY_WINDOW_S / 86400:.0f} days ago: ask an admin"
        return Verdict(False, "not-own-remedy", why)
    others = [j for j in facts.jobs if holds(j, req.node) and j.user_id != caller.uid]
    if others:
        why = f"{req.node} holds job {others[0].job_id} of another user (uid {others[0].user_id}): not reserved"
        return Verdict(False, "shared-node", why)
    why = f"{req.node} was drained by {caller.name} through the guard at {drain.at:.0f}"
    return Verdict(True, "own-remedy", why, drain.job, drain.job_nodes)


def _own_reservation(caller: Caller, req: Request, facts: Facts) -> Verdict:
    if in_own_reservation(caller, facts):
        return Verdict(True, "own-remedy", f"{req.node} is in {caller.name}'s maintenance reservation")
    why = f"{req.node} is not in a maintenance reservation of {caller.name}: {req.op} needs your own RESERVE first"
    return Verdict(False, "not-own-remedy", why)


def reservation_name(node: str) -> str:
    """One maintenance reservation per node; ``node`` already satisfies NODE_NAME."""
    return f"{RESERVATION_PREFIX}{node}"


def remedy_reason(caller: Caller, req: Request) -> str:
    """The Slurm reason of a REBOOT: the guard's prefix with the caller's account (as every reason
    the guard writes: issue 32, finding 12), so the daemon knows the node as its own."""
    if req.op != Op.REBOOT:
        return ""
    run = req.run or "-"
    return node_reason(account_label(caller.name, caller.uid), run, f"reboot: {clean_cause(req.cause)}")[:200]
