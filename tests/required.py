"""What a test does when a server it needs cannot run: under ``CI=true`` it fails (a tier must not
pass by skipping), elsewhere it skips; both say why."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from supervisor.testing.servers.s3servers import S3Server


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def cannot_run(what: str, reason: str) -> NoReturn:
    if under_ci():
        pytest.fail(f"{what} is required under CI=true but cannot run: {reason}", pytrace=False)
    pytest.skip(f"{what} not available: {reason}")


def started(session: S3Server | str, what: str) -> S3Server:
    """The session's server, or the test ends here (``session``: the server, or why it cannot start)."""
    if isinstance(session, str):
        cannot_run(what, session)
    return session
