"""The hooks run as root on every compute node: nothing in their working directory is imported,
their spool and token are used only when no one else could have planted them, and a name that
does not resolve cannot stretch a prolog past its deadline (issue 17, item 7; review findings #15
and #16). Each attack here failed on the old code."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from supervisor.agent.hooks import Spool, run_hook
from supervisor.agent.oneshot import check_once
from supervisor.agent.sender import HttpSender, SenderSettings
from supervisor.config import load_hooks_config
from supervisor.domain.health.node_report import SCHEMA_VERSION, NodeReport

REPO = Path(__file__).resolve().parents[2]
OTHER_UID = 4242 if os.getuid() != 4242 else 4243


def plant(folder: Path, marker: Path) -> None:
    """A `supervisor` package that, once imported, says so."""
    pkg = folder / "supervisor"
    (pkg / "agent").mkdir(parents=True)
    code = f"open({str(marker)!r}, 'w').write('imported')\n"
    for name in ("__init__.py", "__main__.py", "agent/__init__.py", "agent/oneshot.py"):
        (pkg / name).write_text(code)


def report(node: str = "gpu001") -> NodeReport:
    return NodeReport(v=SCHEMA_VERSION, node=node, seq=1, at=time.time(), source="prolog")


def test_the_hook_scripts_do_not_import_a_package_planted_in_their_working_directory(tmp_path):
    marker = tmp_path / "imported"
    work = tmp_path / "cwd"
    plant(work, marker)
    config = tmp_path / "hooks.toml"
    config.write_text(f'[hooks]\nspool_dir = "{tmp_path / "spool"}"\nnvml_timeout_s = 5\n')
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SLURM_SUPERVISOR_PYTHON": sys.executable,
        "SLURM_SUPERVISOR_HOOKS_CONFIG": str(config),
        "SLURMD_NODENAME": "gpu001",
    }
    for kind in ("prolog", "epilog", "healthcheck"):
        done = subprocess.run(
            ["/bin/sh", str(REPO / "hooks" / kind)], cwd=work, env=env, capture_output=True, timeout=60
        )
        assert not marker.exists(), f"hooks/{kind} imported the planted package: {done.stderr[-500:]!r}"
        assert b'"event": "hook_' in done.stderr, done.stderr[-500:]


def test_the_nvml_child_does_not_import_a_package_planted_in_the_working_directory(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    plant(tmp_path, marker)
    monkeypatch.chdir(tmp_path)
    check_once(10.0, node="gpu001")
    assert not marker.exists(), "check_once's child imported the planted package"


# ------------------------------------------------------------------ the spool


def test_a_spool_folder_others_may_write_is_not_used(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o777)
    spool.chmod(0o777)
    assert Spool(spool, 10).put(report()) == 0
    assert list(spool.iterdir()) == []


def test_a_spool_folder_of_another_user_is_not_used(tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    os.chown(spool, OTHER_UID, -1)
    assert Spool(spool, 10).put(report()) == 0
    assert list(spool.iterdir()) == []


def test_a_spool_folder_that_is_a_link_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (tmp_path / "spool").symlink_to(target)
    assert Spool(tmp_path / "spool", 10).put(report()) == 0
    assert list(target.iterdir()) == []


def test_a_fifo_in_the_spool_blocks_nothing(tmp_path):
    spool = Spool(tmp_path / "spool", 10)
    assert spool.put(report()) == 1
    os.mkfifo(tmp_path / "spool" / "00000000000000000000-fifo.json")
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(spool.take()), daemon=True)
    reader.start()
    reader.join(5.0)
    if not result:  # let the blocked reader go before failing
        os.close(os.open(tmp_path / "spool" / "00000000000000000000-fifo.json", os.O_WRONLY | os.O_NONBLOCK))
    assert result, "a FIFO in the spool blocked the hook"
    files, reports = result[0]
    assert [r.node for r in reports] == ["gpu001"]


# ------------------------------------------------------------------ the token


def test_a_token_file_others_can_read_is_not_used(tmp_path):
    token = tmp_path / "hook.token"
    token.write_text("site-hook-token\n")
    token.chmod(0o644)
    config = tmp_path / "hooks.toml"
    config.write_text(
        f'[hooks]\nurl = "http://127.0.0.1:9"\ntoken_file = "{token}"\nspool_dir = "{tmp_path / "spool"}"\n'
        "nvml_timeout_s = 5\npost_timeout_s = 1\n"
    )
    out = run_hook("epilog", load_hooks_config(config), {"SLURMD_NODENAME": "gpu001"})
    assert any("hook.token" in note and "644" in note for note in out.notes), out.notes


# ------------------------------------------------------------------ DNS


@pytest.mark.timing
def test_a_name_that_does_not_resolve_in_time_does_not_stretch_the_deadline(tmp_path):
    never = threading.Event()

    def stuck_resolver(host: str, port: int):  # a resolver that never answers (a dead DNS server)
        never.wait(30)
        raise OSError("gave up")

    settings = SenderSettings(timeout_s=0.5)
    sender = HttpSender("http://daemon.example:8471", "HOOKS", "t", "gpu001", settings, resolve=stuck_resolver)
    sender.add(report())
    started = time.monotonic()
    assert sender.flush(time.time(), force=True) is False
    never.set()
    assert time.monotonic() - started < 2.5
