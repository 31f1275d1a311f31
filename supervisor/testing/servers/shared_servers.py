"""One test S3 server per class for the whole test process, whichever folders' fixtures ask for it.

``session_server`` (supervisor.testing.servers.s3servers) starts a server per session fixture; two
folders each with its own session fixture (tests/checkpoints, tests/e2e) would start Ceph twice
(~13 s each). ``shared_server`` hands every such fixture the same server and stops it when the
last of them is torn down::

    @pytest.fixture(scope="session")
    def _rgw_session():
        yield from shared_server(CephRgw)

The first caller's keyword arguments start the server; later callers get it as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from supervisor.testing.servers.s3servers import CephRgw, MotoS3, S3Server, S3ServerError

__all__ = ["shared_server"]

_servers: dict[type[S3Server], S3Server | str] = {}  # started server, or why it cannot start
_users: dict[type[S3Server], int] = {}


def shared_server(cls: type[MotoS3] | type[CephRgw], **kwargs: Any) -> Iterator[S3Server | str]:
    """For a session fixture: the process's server of ``cls`` (started on first use), or why it
    cannot run (a test then skips, or fails under ``CI=true``)."""
    if cls not in _servers:
        _servers[cls] = _start(cls, **kwargs)
    _users[cls] = _users.get(cls, 0) + 1
    try:
        yield _servers[cls]
    finally:
        _users[cls] -= 1
        if _users[cls] == 0:
            server = _servers.pop(cls)
            if isinstance(server, S3Server):
                server.stop()


def _start(cls: type[MotoS3] | type[CephRgw], **kwargs: Any) -> S3Server | str:
    reason = cls.unavailable_reason()
    if reason:
        return reason
    server = cls(**kwargs)
    try:
        return server.start()
    except S3ServerError as exc:
        return str(exc)
