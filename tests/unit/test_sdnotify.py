"""SystemdNotifier against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.sdnotify import SystemdNotifier


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A bound datagram socket, as systemd's notify socket; yields (NOTIFY_SOCKET, socket)."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        yield str(path), sock


def received(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_each_message_arrives(systemd: tuple[str, socket.socket]) -> None:
    address, sock = systemd
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address})
    assert notifier.enabled
    assert notifier.ready() and received(sock) == "READY=1"
    assert notifier.watchdog() and received(sock) == "WATCHDOG=1"
    assert notifier.status("supervising 3 runs") and received(sock) == "STATUS=supervising 3 runs"
    assert notifier.stopping() and received(sock) == "STOPPING=1"


def test_status_is_one_line(systemd: tuple[str, socket.socket]) -> None:
    address, sock = systemd
    SystemdNotifier({"NOTIFY_SOCKET": address}).status("two\nlines")
    assert received(sock) == "STATUS=two lines"


def test_several_assignments_in_one_datagram(systemd: tuple[str, socket.socket]) -> None:
    address, sock = systemd
    SystemdNotifier({"NOTIFY_SOCKET": address}).notify("READY=1", "STATUS=up")
    assert received(sock) == "READY=1\nSTATUS=up"


def test_abstract_socket() -> None:
    name = f"slurm-supervisor-test-{os.getpid()}-{id(object())}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert SystemdNotifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert received(sock) == "READY=1"


def test_no_socket_means_no_op() -> None:
    notifier = SystemdNotifier({})
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.watchdog() is False
    assert notifier.watchdog_interval() is None


def test_reads_the_real_environment_by_default(
    systemd: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, sock = systemd
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    assert SystemdNotifier().ready() and received(sock) == "READY=1"


def test_unsupported_socket_kind_is_logged_and_ignored() -> None:
    with capture_logs() as logs:
        notifier = SystemdNotifier({"NOTIFY_SOCKET": "vsock:2:1234"})
    assert not notifier.enabled
    assert logs[0]["event"] == "sd_notify_unsupported_socket"


def test_gone_socket_is_logged_not_raised(tmp_path: Path) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    with capture_logs() as logs:
        assert notifier.watchdog() is False
    assert logs[0]["event"] == "sd_notify_failed" and logs[0]["log_level"] == "warning"


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "60000000"}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "4242"}, 30.0),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "x"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({"WATCHDOG_PID": "4242"}, None),
        ({}, None),
    ],
)
def test_watchdog_interval(env: dict[str, str], expected: float | None) -> None:
    assert SystemdNotifier(env, pid=4242).watchdog_interval() == expected


def test_watchdog_interval_uses_our_pid_by_default() -> None:
    env = {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}
    assert SystemdNotifier(env).watchdog_interval() == 1.0
