"""Node reboots for the private test cluster (``LocalSlurm(reboot=True)``).

slurm.conf's ``RebootProgram`` is a script that only leaves a request file naming its node (each
slurmd runs with ``LOCALSLURM_NODE`` set, and slurmd runs the program through ``system()``, so it
inherits that variable). A thread of the harness takes the request and "reboots" the node the way
a reboot would: every process of the node (slurmd, its steps, its jobs) is killed, and after
``boot_s`` a new slurmd starts inside a new time namespace whose boot-time clock is offset so that
the node's uptime starts near zero. slurmd reports its boot time from that clock (``sysinfo``),
and slurmctld counts a reboot it asked for as done only when the node registers with a boot time
later than the request: the same check a real reboot passes. A plain ``restart_node`` (a crash
and restart) keeps the host's boot time, so Slurm can tell the two apart as it would on metal.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from supervisor.testing.slurm._daemon import Daemon, find_binary

log = structlog.get_logger()

NODE_ENV = "LOCALSLURM_NODE"
MIN_BOOT_S = 3.0
FRESH_UPTIME_S = 0  # whole seconds of uptime a rebooted node starts with (its boot time must follow the request)


def reboot_script(requests: Path) -> str:
    """The RebootProgram: one request file per reboot, named after the node."""
    folder = shlex.quote(str(requests))
    return f'#!/bin/sh\nset -e\n[ -n "${NODE_ENV}" ]\n: > {folder}/"${NODE_ENV}"\n'


def host_uptime_s() -> int:
    return int(float(Path("/proc/uptime").read_text().split()[0]))


def booted_argv(argv: list[str]) -> list[str]:
    """``argv`` inside a new time namespace where the uptime starts at FRESH_UPTIME_S."""
    unshare = find_binary("unshare")
    if unshare is None:
        raise OSError("unshare (util-linux) not found: reboots need time namespaces")
    offset = host_uptime_s() - FRESH_UPTIME_S
    return [unshare, "--time", f"--boottime=-{max(offset, 0)}", *argv]


def conf_settings(program: Path) -> dict[str, str]:
    """slurm.conf lines for reboots: the program, and how long slurmctld waits for the node."""
    return {"RebootProgram": str(program), "ResumeTimeout": "60"}


def write_program(root: Path) -> Path:
    """The reboot folder and its RebootProgram under the cluster's root."""
    requests = root / "reboots"
    requests.mkdir(mode=0o700, exist_ok=True)
    program = root / "reboot-program"
    program.write_text(reboot_script(requests))
    program.chmod(0o755)
    return program


def reboot_daemon(daemon: Daemon, base_argv: list[str], env: dict[str, str], boot_s: float) -> None:
    """Every process of the node dies, and after ``boot_s`` its slurmd starts with a new boot time."""
    daemon.kill()
    # The node is away, as during a reboot, and long enough that the new boot time slurmd reports
    # (whole seconds, the uptime rounded up by sysinfo) lies after the second the reboot was asked.
    time.sleep(max(boot_s, MIN_BOOT_S))
    daemon.argv = booted_argv(base_argv)
    daemon.spawn(env)


class Rebooter:
    """Watches ``requests`` and calls ``reboot(node)`` for each request file, then removes it."""

    def __init__(self, requests: Path, reboot: Callable[[str], None], nodes: list[str]) -> None:
        self.requests, self._reboot, self._nodes = requests, reboot, set(nodes)
        self.rebooted: list[tuple[str, float]] = []  # (node, when) of every reboot done
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="localslurm-reboots", daemon=True)

    def start(self) -> Rebooter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10.0)

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            for request in sorted(self.requests.iterdir()):
                request.unlink(missing_ok=True)
                if request.name in self._nodes:
                    self._do(request.name)

    def _do(self, node: str) -> None:
        try:
            self._reboot(node)
        except Exception as exc:  # noqa: BLE001 - a failed reboot leaves the node down, as on metal; logged
            log.error("localslurm.reboot_failed", node=node, error=repr(exc))
            return
        self.rebooted.append((node, time.time()))
        log.info("localslurm.rebooted", node=node)
