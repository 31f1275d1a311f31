"""The harness's reboots (testing/slurm/_reboot.py) without Slurm: the RebootProgram leaves one
request naming its node, the watcher reboots exactly the nodes it knows, once per request, and a
rebooted slurmd starts in a time namespace whose uptime is near zero (so its boot time is new)."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from supervisor.testing.slurm._reboot import NODE_ENV, Rebooter, booted_argv, write_program


def test_the_reboot_program_leaves_a_request_named_after_its_node(tmp_path: Path) -> None:
    program = write_program(tmp_path)
    done = subprocess.run([str(program)], env={**os.environ, NODE_ENV: "n2"}, check=False)
    assert done.returncode == 0 and [p.name for p in (tmp_path / "reboots").iterdir()] == ["n2"]
    nameless = subprocess.run([str(program)], env={k: v for k, v in os.environ.items() if k != NODE_ENV}, check=False)
    assert nameless.returncode != 0  # a slurmd without its node's name asks nothing


def test_the_watcher_reboots_known_nodes_once_per_request(tmp_path: Path) -> None:
    requests = tmp_path / "reboots"
    requests.mkdir()
    seen: list[str] = []
    both = threading.Event()

    def reboot(node: str) -> None:
        seen.append(node)
        if len(seen) == 2:
            both.set()

    rebooter = Rebooter(requests, reboot, ["n1", "n2"]).start()
    try:
        for name in ("n1", "x9", "n2"):
            (requests / name).touch()
        assert both.wait(10)
    finally:
        rebooter.stop()
    assert sorted(seen) == ["n1", "n2"] and list(requests.iterdir()) == []
    assert [n for n, _ in rebooter.rebooted] == seen


def test_a_rebooted_node_starts_with_a_fresh_uptime() -> None:
    argv = booted_argv(["/bin/cat", "/proc/uptime"])
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0 and os.environ.get("CI", "").lower() != "true":
        pytest.skip(f"no time namespaces here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[0]) < 5  # the host has been up for longer
