"""Fixtures the unit tests share."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from supervisor.testing.kit.clock import ManualClock


@pytest.fixture
def unanswering() -> Iterator[int]:
    """A loopback port whose accept queue is full: connects to it neither finish nor fail (the
    SYNs are dropped), as to a hung node."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    filler = socket.create_connection(server.getsockname())
    yield server.getsockname()[1]
    filler.close()
    server.close()


@pytest.fixture
def clock() -> ManualClock:
    """A test's manual clock (``supervisor.testing.kit.clock``), at the guard tests' usual start."""
    return ManualClock(1_000_000.0)
