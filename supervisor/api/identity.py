"""Identities from the kernel: the peer of a Unix socket (``SO_PEERCRED``, ``SO_PEERGROUPS``), this
process, and the instance the daemon is. Names come from the passwd and group databases, never
from ``$USER``/``$LOGNAME`` (anyone can set those)."""

from __future__ import annotations

import errno
import grp
import os
import pwd
import socket
import struct

from supervisor.api.access import Caller, Group, Instance

_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13; Python does not name it
_GID = struct.Struct("I")


def user_name(uid: int) -> str:
    """The passwd name of ``uid``, or ``uid N`` when the database has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def peer(conn: socket.socket) -> Caller:
    """Who is at the other end of a connected Unix socket, as the kernel recorded at connect()."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, gid = struct.unpack("3i", creds)
    name = user_name(uid)
    return Caller(uid, name, frozenset({gid, *_peer_groups(conn, name, gid)}))


def _peer_groups(conn: socket.socket, name: str, gid: int) -> set[int]:
    """The peer's supplementary groups as its process held them; the group database's view of the
    user where the kernel cannot tell (before Linux 4.13)."""
    for size in (256, 65536):
        try:
            raw = conn.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, size * _GID.size)
        except OSError as exc:
            if exc.errno == errno.ERANGE:
                continue
            if exc.errno in (errno.ENOPROTOOPT, errno.EINVAL):
                break
            raise
        return {g for (g,) in _GID.iter_unpack(raw[: len(raw) - len(raw) % _GID.size])}
    try:
        return set(os.getgrouplist(name, gid))
    except (KeyError, OSError):
        return set()


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
