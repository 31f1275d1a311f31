"""Identities from the kernel: the peer of a Unix socket (``SO_PEERCRED``, its groups from the
group database), this process, and the instance the daemon is. Names come from the passwd and group databases, never
from ``$USER``/``$LOGNAME`` (anyone can set those)."""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct

from supervisor.api.access import Caller, Group, Instance


def user_name(uid: int) -> str:
    """The passwd name of ``uid``, or ``uid N`` when the database has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def peer(conn: socket.socket) -> Caller:
    """Who is at the other end of a connected Unix socket: the UID the kernel recorded at connect(),
    its groups from the passwd and group databases. Not the peer process's own groups
    (``SO_PEERGROUPS``, its gid): a setgid program's are its own, and a process started before its
    account left a group keeps that group (review 2026-12-02, finding 15; the guard does the same)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return Caller(uid, user_name(uid), account_groups(uid))


def account_groups(uid: int) -> frozenset[int]:
    """The account's primary group and every group the group database names it in; none for a UID
    without an account."""
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        return frozenset()
    try:
        return frozenset({account.pw_gid, *os.getgrouplist(account.pw_name, account.pw_gid)})
    except OSError:
        return frozenset({account.pw_gid})


def this_process() -> Caller:
    """The user running this process (real UID), for commands that act on a store directly."""
    uid = os.getuid()
    return Caller(uid, user_name(uid), frozenset(os.getgroups()) | {os.getgid()})


class UnknownGroup(ValueError):
    pass


def instance(group: str | None, admin_group: str | None) -> Instance:
    """This daemon as an instance: its account (effective UID) and the groups its configuration
    names. ``group`` None: the group named like the account, if there is one."""
    uid = os.geteuid()
    name = user_name(uid)
    if group is not None:
        own = _group(group, "[api] group")
    else:
        try:
            own = Group(grp.getgrnam(name).gr_gid, name)
        except KeyError:
            own = None
    admins = _group(admin_group, "[api] admin_group") if admin_group is not None else None
    return Instance(uid, name, own, admins)


def _group(name: str, key: str) -> Group:
    try:
        return Group(grp.getgrnam(name).gr_gid, name)
    except KeyError:
        raise UnknownGroup(
            f"{key} = {name!r}: no such group on this host. Fix: create it (groupadd {name}), or correct the name"
        ) from None
