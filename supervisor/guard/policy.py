"""The guard's decision on one request: grant or refuse, from who asks (the kernel's word, never the
request's), what Slurm shows at that moment and the grants the guard remembers. Pure.

Rules, in order (the first that applies decides; its name goes into the answer and the audit log):

* ``bad-request``: an unknown operation, a malformed node or run name.
* RESUME and quarantine CLEAR: ``admin`` (root or a member of an admin group), else ``admin-only``
  (a non-admin's RESUME, and the remedies RESERVE, REBOOT, UNRESERVE, are ``remedy.py``'s).
* DOWN and DRAIN need a reason to touch the node: ``admin``; ``shared-node`` (refused: a job of
  another user, or of no known user, holds the node too: with ``cons_tres`` nodes are shared unless
  a job is ``--exclusive``, and a DOWN kills every job on the node); ``own-job`` (every job holding
  the node is the caller's, one of them RUNNING); ``follow-up`` (the node was in a job of the
  caller's UID when the guard changed a node of that job for the caller, within ``FOLLOW_UP_S``,
  and no other user's job holds it now: a DOWN ends or requeues the job at once, so the DRAIN that
  follows and the job's other faulty nodes are no longer "in a running job"); ``own-remedy`` (the
  node is in the caller's maintenance reservation: its validation failed); else ``not-own-node``.
* then the cluster-wide cap: at most ``max_drains`` distinct nodes downed or drained through the
  guard within ``window_s``, for all callers together; beyond it ``cluster-cap``. Only a granted
  change counts as a fault of the node (``Verdict.fault``): a refusal takes nothing out of service,
  so it must not keep the node out of every instance's runs either.

The Slurm reason is the guard's own: ``slurm-supervisor: run ACCOUNT/RUN: CAUSE``, printable ASCII,
at most ``MAX_REASON`` characters, ACCOUNT the caller's (the kernel's UID, ``account_label``), RUN
checked against the run-name rule, CAUSE cleaned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum

from supervisor.domain.cluster import JobInfo, JobState
from supervisor.domain.observation import account_label, node_reason

NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
RUN_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")  # the run spec's own rule (config/run_file.py)
MAX_REASON = 200
MAX_CAUSE_IN = 2000  # longer causes are refused before they are cleaned
FOLLOW_UP_S = 600.0
OUT_OF_SERVICE = ("DOWN", "DRAIN")  # the grants the cap and the follow-up rule count


class Op(StrEnum):
    DOWN = "DOWN"
    DRAIN = "DRAIN"
    RESUME = "RESUME"
    CLEAR = "CLEAR"  # forget the node's faults in the shared quarantine
    QUARANTINE = "QUARANTINE"  # list the shared quarantine (read only, anyone)
    RESERVE = "RESERVE"  # a maintenance reservation of the node for the caller (remedy.py)
    REBOOT = "REBOOT"  # scontrol reboot ASAP nextstate=RESUME, into the caller's reservation
    UNRESERVE = "UNRESERVE"  # the caller's maintenance reservation removed, the node left as it is


@dataclass(frozen=True)
class Caller:
    """Who is on the other end of the socket, from SO_PEERCRED and the account databases."""

    uid: int
    gid: int
    pid: int
    name: str
    groups: frozenset[str]

    def admin(self, admin_groups: Iterable[str]) -> bool:
        return self.uid == 0 or bool(self.groups & set(admin_groups))


@dataclass(frozen=True)
class Request:
    op: str
    node: str = ""
    run: str = ""
    cause: str = ""


@dataclass(frozen=True)
class Grant:
    """A DOWN or DRAIN the guard made: what the cap counts and a follow-up DRAIN relies on."""

    node: str
    uid: int
    change: str
    at: float
    job: int | None = None
    job_nodes: tuple[str, ...] = ()  # the job's nodes when the guard verified it


@dataclass(frozen=True)
class Reservation:
    """A maintenance reservation the guard made for one caller on one node (remedy.py)."""

    node: str
    uid: int
    name: str
    at: float
    until: float


@dataclass(frozen=True)
class Limits:
    admin_groups: frozenset[str] = frozenset()
    max_drains: int = 8
    window_s: float = 3600.0
    reservation_minutes: int = 120  # a maintenance reservation ends by itself after this (remedy.py)


@dataclass(frozen=True)
class Facts:
    now: float
    jobs: tuple[JobInfo, ...] = ()  # the jobs on the node, read at the moment of the request (DOWN/DRAIN only)
    grants: tuple[Grant, ...] = ()  # the guard's grants within the window
    own_drain: Grant | None = None  # the node's latest DOWN/DRAIN through the guard, unless resumed or cleared since
    reservation: Reservation | None = None  # the guard's maintenance reservation of the node, if any


@dataclass(frozen=True)
class Verdict:
    granted: bool
    rule: str
    why: str
    job: int | None = None
    job_nodes: tuple[str, ...] = ()
    reason: str = ""  # the Slurm reason the guard writes (DOWN/DRAIN granted)
    fault: bool = False  # counts toward the shared quarantine
    frees_at: float | None = None  # cluster-cap: when a slot frees


def decide(caller: Caller, req: Request, facts: Facts, limits: Limits) -> Verdict:
    invalid = problem(req)
    if invalid:
        return Verdict(False, "bad-request", invalid)
    admin = caller.admin(limits.admin_groups)
    if req.op in (Op.RESUME, Op.CLEAR, Op.QUARANTINE):
        if admin or req.op == Op.QUARANTINE:
            return Verdict(True, "admin" if admin else "read", f"{req.op} {req.node}".strip())
        return Verdict(False, "admin-only", f"{req.op} is for admins (root or groups {sorted(limits.admin_groups)})")
    owner = _owner(caller, req, facts, admin)
    if not owner.granted:
        return owner
    capped = _capped(req.node, facts, limits)
    if capped is not None:
        return replace(capped, job=owner.job)
    account = account_label(caller.name, caller.uid)
    return replace(owner, reason=slurm_reason(account, req.run, req.cause), fault=True)


def problem(req: Request) -> str:
    """What is wrong with the request's shape; empty when nothing."""
    if req.op not in set(Op):
        return f"unknown op {req.op[:20]!r}; one of {', '.join(Op)}"
    if req.op != Op.QUARANTINE and not NODE_NAME.match(req.node):
        return "node: 1-64 letters, digits, '.', '_' or '-'"
    if req.op in (Op.DOWN, Op.DRAIN, Op.REBOOT, Op.RESERVE) and not RUN_NAME.match(req.run):
        return "run: 1-63 lowercase letters, digits, '.', '_' or '-' (the run spec's rule)"
    if len(req.cause) > MAX_CAUSE_IN:
        return f"cause: at most {MAX_CAUSE_IN} characters"
    return ""


def _owner(caller: Caller, req: Request, facts: Facts, admin: bool) -> Verdict:
    """May this caller touch this node at all (before the cap)?"""
    on_node = [j for j in facts.jobs if holds(j, req.node)]
    if admin:
        return Verdict(True, "admin", f"{caller.name} is an admin", on_node[0].job_id if on_node else None)
    others = [j for j in on_node if j.user_id is None or j.user_id != caller.uid]
    mine = [j for j in on_node if j.user_id == caller.uid and j.state is JobState.RUNNING]
    if others and (mine or _followed_up(caller, req, facts)):
        why = (
            f"{req.node} also holds job {others[0].job_id} of another user (uid {others[0].user_id}): "
            "a DOWN or DRAIN of a shared node is for an admin; submit with --exclusive to own whole nodes"
        )
        return Verdict(False, "shared-node", why, mine[0].job_id if mine else None)
    if mine and not others:
        why = f"{req.node} runs job {mine[0].job_id} of {caller.name}, and no other user's job"
        return Verdict(True, "own-job", why, mine[0].job_id, mine[0].nodes)
    grant = None if others else _followed_up(caller, req, facts)
    if grant is not None:
        why = (
            f"{req.node} was in job {grant.job} of {caller.name} when the guard changed {grant.node} at {grant.at:.0f}"
        )
        return Verdict(True, "follow-up", why, grant.job, grant.job_nodes)
    if not others and in_own_reservation(caller, facts):
        why = f"{req.node} is in {caller.name}'s maintenance reservation (the guard's own remedy)"
        return Verdict(True, "own-remedy", why, mine[0].job_id if mine else None)
    why = f"{req.node} is not allocated to a running job of {caller.name} (uid {caller.uid})"
    return Verdict(False, "not-own-node", why)


def in_own_reservation(caller: Caller, facts: Facts) -> bool:
    """The node is in the caller's live maintenance reservation, made by the guard."""
    r = facts.reservation
    return r is not None and r.uid == caller.uid and facts.now < r.until


def holds(job: JobInfo, node: str) -> bool:
    """Does the job hold ``node`` now? Any state but pending and ended does (running, suspended,
    completing, configuring, or one this release names and we do not: a DOWN would kill it)."""
    return node in job.nodes and job.state is not JobState.PENDING and not job.state.finished


def _followed_up(caller: Caller, req: Request, facts: Facts) -> Grant | None:
    """The caller's recent grant whose job held this node, if any."""
    for g in facts.grants:
        if g.change not in OUT_OF_SERVICE:  # a RESUME after a remedy is in the memory too
            continue
        if g.uid == caller.uid and req.node in (g.node, *g.job_nodes) and facts.now - g.at <= FOLLOW_UP_S:
            return g
    return None


def _capped(node: str, facts: Facts, limits: Limits) -> Verdict | None:
    """The cluster-wide cap, if this node would go over it; None when there is room."""
    last: dict[str, float] = {}
    for g in facts.grants:
        if g.change in OUT_OF_SERVICE and facts.now - limits.window_s <= g.at <= facts.now:
            last[g.node] = max(g.at, last.get(g.node, g.at))
    if node in last or len(last) < limits.max_drains:
        return None
    frees_at = min(last.values(), default=facts.now) + limits.window_s
    why = (
        f"the cluster-wide cap is reached: {len(last)} node(s) downed or drained through the guard in the "
        f"last {limits.window_s:.0f} s (max_drains = {limits.max_drains}); next slot at {frees_at:.0f}"
    )
    return Verdict(False, "cluster-cap", why, frees_at=frees_at)


def clean_cause(text: str) -> str:
    """Printable ASCII only (anything else becomes a space), whitespace collapsed."""
    printable = "".join(c if " " <= c <= "~" else " " for c in text)
    return " ".join(printable.split()) or "no cause given"


def slurm_reason(account: str, run: str, cause: str) -> str:
    """The reason the guard writes into Slurm; ``run`` must already satisfy RUN_NAME, ``account``
    is an ``account_label``: the caller's, so a run name another account chose blames that account."""
    assert RUN_NAME.match(run), run
    return node_reason(account, run, clean_cause(cause))[:MAX_REASON]
