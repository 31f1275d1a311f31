"""Who may do what through an instance's API. Pure rules over identities the kernel gave
(``SO_PEERCRED``, ``SO_PEERGROUPS``), never over names a caller claims.

An instance runs as one account and its jobs run as that account. So:

- **submit** (a job then runs as the account): the account itself and members of the instance's
  group. Admins do not: they would run code as another account.
- **act on a run** (read its status and logbook, cancel it, add a note): its owner (who submitted
  it; runs from before owners were recorded belong to the account), the account, members of the
  instance's group, members of the admin group.
- **act on the instance** (the nodes it took out, its quarantine list, clearing a quarantine):
  the account, members of the instance's group, members of the admin group.

root may do everything (it can anyway). Every refusal names the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

ROOT_UID = 0


@dataclass(frozen=True)
class Caller:
    """Who is asking, as the kernel says: UID, its name from the passwd database, and groups."""

    uid: int
    name: str
    gids: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Group:
    gid: int
    name: str


@dataclass(frozen=True)
class Instance:
    """The daemon's own identity and the groups its configuration names."""

    uid: int  # the account the daemon runs as; its jobs run as it
    name: str
    group: Group | None = None  # members submit and act on every run
    admins: Group | None = None  # members act on every run; they do not submit


class Reach(StrEnum):
    SUBMIT = "submit"
    RUN = "run"
    INSTANCE = "instance"


@dataclass(frozen=True)
class Decision:
    """Allowed or not, and the rule that decided (shown to the caller when refused)."""

    allowed: bool
    rule: str


def kept_for(caller: Caller, inst: Instance) -> bool:
    """May this caller use the API's last connection slots, kept from strangers? root, the
    account, members of the instance's group: those who run its runs."""
    if caller.uid in (ROOT_UID, inst.uid):
        return True
    return inst.group is not None and inst.group.gid in caller.gids


def may_submit(caller: Caller, inst: Instance) -> Decision:
    granted = _granted(caller, inst, owner=None, admins=False)
    if granted:
        return Decision(True, granted)
    who = _who(inst, owner=None, admins=False)
    return Decision(
        False,
        f"{_caller(caller)} may not submit to the instance of {inst.name}: its jobs run as {inst.name}, "
        f"so only {who} may",
    )


def may_act_on_run(caller: Caller, inst: Instance, run: str, owner: tuple[int, str] | None, verb: str) -> Decision:
    """``owner``: (uid, name) of who registered the run; None: the instance's account."""
    owner_uid = owner[0] if owner else inst.uid
    granted = _granted(caller, inst, owner=owner_uid, admins=True)
    if granted:
        return Decision(True, granted)
    owner_name = owner[1] if owner else inst.name
    who = _who(inst, owner=owner_name if owner_uid != inst.uid else None, admins=True)
    return Decision(False, f"{_caller(caller)} may not {verb} run {run!r}: only {who} may")


def may_act_on_instance(caller: Caller, inst: Instance, verb: str) -> Decision:
    granted = _granted(caller, inst, owner=None, admins=True)
    if granted:
        return Decision(True, granted)
    who = _who(inst, owner=None, admins=True)
    return Decision(False, f"{_caller(caller)} may not {verb} on the instance of {inst.name}: only {who} may")


def _granted(caller: Caller, inst: Instance, *, owner: int | None, admins: bool) -> str:
    """The rule that lets the caller in, or "" when none does."""
    if caller.uid == ROOT_UID:
        return "root"
    if caller.uid == inst.uid:
        return f"the instance's account {inst.name}"
    if owner is not None and caller.uid == owner:
        return "the run's owner"
    if inst.group is not None and inst.group.gid in caller.gids:
        return f"a member of the instance's group {inst.group.name}"
    if admins and inst.admins is not None and inst.admins.gid in caller.gids:
        return f"a member of the admin group {inst.admins.name}"
    return ""


def _who(inst: Instance, *, owner: str | None, admins: bool) -> str:
    parts = [f"its owner {owner}"] if owner else []
    parts.append(f"the account {inst.name}")
    if inst.group is not None:
        parts.append(f"members of group {inst.group.name}")
    if admins and inst.admins is not None:
        parts.append(f"members of the admin group {inst.admins.name}")
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


def _caller(caller: Caller) -> str:
    return f"{caller.name} (uid {caller.uid})"
