"""A private multi-node Slurm cluster on this host, for tests and fault injection.

One munged, one slurmctld and N slurmd (``slurmd -D -N nX``; Debian builds Slurm with
MULTIPLE_SLURMD) share 127.0.0.1 with ports chosen at runtime. Everything (slurm.conf, state,
spool, logs, pid files, munge key and socket) lives under one temporary directory; clients reach
the cluster through ``SLURM_CONF`` (see ``env`` and ``run``). Nothing in /etc is touched.

Each slurmd starts inside its own cgroup v2 directory, so its slurmstepds and job processes (its
descendants) are inside it too: ``crash_node`` kills them all at once (cgroup.kill),
``freeze_node`` hangs them all (cgroup.freeze). Needs root, the Slurm and munge binaries and a
writable cgroup2 mount (``unavailable_reason`` says what is missing).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import structlog

from supervisor.testing.slurm import _conf, _reboot
from supervisor.testing.slurm._cgroup import Cgroup, find_cgroup_parent
from supervisor.testing.slurm._daemon import (
    Daemon,
    LocalSlurmError,
    clean_env,
    find_binary,
    free_ports,
    search_path,
    unavailable_reason,
)
from supervisor.testing.slurm.accounting import Accounting

log = structlog.get_logger()

T = TypeVar("T")

__all__ = ["LocalSlurm", "LocalSlurmError", "unavailable_reason"]


class LocalSlurm:
    """A private Slurm cluster; use as a context manager (``with LocalSlurm() as cluster:``).

    Attributes once started: ``root`` (its directory), ``slurm_conf``, ``env`` (SLURM_CONF and
    PATH for clients), ``nodes`` (names), ``partition``, ``ctld_port``, ``node_ports``.
    With ``accounting=True`` the cluster keeps job records in a real slurmdbd over a private
    MariaDB (``accounting``, see supervisor.testing.slurm.accounting): ``sacct`` answers.
    ``extra_nodes`` (``ExtraNodes``) adds thousands of nodes to the node table and the partition
    whose slurmd never starts (a large cluster's controller load, for benchmarks).
    With ``reboot=True`` slurm.conf names a ``RebootProgram`` and ``scontrol reboot`` reboots a
    node the way a reboot would (``_reboot``: its processes die, its slurmd comes back after
    ``boot_s`` with a new boot time); ``reboots`` lists the reboots done.
    ``partition_options`` are more ``Key=Value`` words of the partition's line (``PreemptMode=REQUEUE
    GraceTime=10``); ``extra_partitions`` maps more partitions over the same nodes to theirs
    (``{"urgent": "PriorityTier=2"}``): with ``PreemptType=preempt/partition_prio`` in
    ``extra_conf``, a job there preempts the partition's.
    """

    def __init__(
        self,
        nodes: int = 4,
        *,
        prefix: str = "n",
        partition: str = "main",
        base_dir: str | os.PathLike[str] | None = None,
        extra_conf: Mapping[str, str] | None = None,
        cpus_per_node: int = 1,
        ready_timeout: float = 30.0,
        keep_dir: bool = False,
        accounting: bool = False,
        extra_nodes: _conf.ExtraNodes | None = None,
        reboot: bool = False,
        boot_s: float = 3.0,
        partition_options: str = "",
        extra_partitions: Mapping[str, str] | None = None,
    ) -> None:
        self.nodes = [f"{prefix}{i}" for i in range(1, nodes + 1)]
        self.partition = partition
        self.extra_conf = dict(extra_conf or {})
        self.cpus_per_node = cpus_per_node
        self.ready_timeout = ready_timeout
        self.keep_dir = keep_dir
        self._base_dir = base_dir
        self.root = Path()
        self.slurm_conf = Path()
        self.env: dict[str, str] = {}
        self.ctld_port = 0
        self.node_ports: dict[str, int] = {}
        self._cgroup_root: Cgroup | None = None
        self._munged: Daemon | None = None
        self._ctld: Daemon | None = None
        self._slurmd: dict[str, Daemon] = {}
        self.accounting: Accounting | None = None
        self._with_accounting = accounting
        self.extra_nodes = extra_nodes  # defined only: their slurmd never starts
        self._with_reboot, self.boot_s = reboot, boot_s
        self._rebooter: _reboot.Rebooter | None = None
        self._base_argv: dict[str, list[str]] = {}  # each slurmd's argv outside any time namespace
        self.partitions = _conf.Partitions(partition, partition_options, dict(extra_partitions or {}))

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalSlurm:
        """Start munged, slurmctld and every slurmd; return once every node is idle."""
        reason = unavailable_reason()
        if reason:
            raise LocalSlurmError(reason)
        started = time.monotonic()
        try:
            self._prepare()
            self._start_munged()
            if self.accounting is not None:
                self.accounting.start(self._env())
                self.accounting.register(self.run)
            self._ctld = self._daemon("slurmctld", ["slurmctld", "-D", "-i"], "slurmctld")
            self.start_controller()
            for name in self.nodes:
                self._slurmd[name] = self._daemon(f"slurmd {name}", ["slurmd", "-D", "-N", name], f"slurmd-{name}")
                self._base_argv[name] = list(self._slurmd[name].argv)
                self._slurmd[name].spawn(self._node_env(name))
            if self._with_reboot:
                requests = self.root / "reboots"
                self._rebooter = _reboot.Rebooter(requests, self._reboot_node, self.nodes).start()
            self.wait_nodes_idle(timeout=self.ready_timeout)
        except BaseException:
            self.stop()
            raise
        log.info(
            "localslurm.started",
            root=str(self.root),
            nodes=len(self.nodes),
            seconds=round(time.monotonic() - started, 2),
        )
        return self

    def stop(self) -> None:
        """Kill every daemon and job process (by cgroup and recorded PID), remove the cgroups and
        (unless ``keep_dir``) the directory. Best effort: a failing step is logged, the rest runs."""
        steps: list[tuple[str, Callable[[], None]]] = [(d.name, d.kill) for d in self._slurmd.values()]
        if self._rebooter is not None:
            steps.insert(0, ("reboots", self._rebooter.stop))
        for daemon in (self._ctld, self.accounting, self._munged):  # slurmdbd after slurmctld, before munged
            if daemon is not None:
                steps.append((daemon.name, functools.partial(daemon.terminate, timeout=5.0)))
        if self._cgroup_root is not None:
            steps.append(("cgroups", self._cgroup_root.destroy))
        for name, step in steps:
            try:
                step()
            except (OSError, subprocess.SubprocessError, LocalSlurmError) as exc:
                log.warning("localslurm.stop_failed", daemon=name, error=str(exc))
        self._cgroup_root = None
        if self.root != Path() and not self.keep_dir:
            shutil.rmtree(self.root, ignore_errors=True)
        log.info("localslurm.stopped", root=str(self.root), kept=self.keep_dir)

    # ----------------------------------------------------------------- setup

    def _prepare(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="lslurm-", dir=self._base_dir))
        self.root.chmod(0o755)  # munged wants its socket directory searchable by all
        for sub in ("state", "spool", "log", "run", *(f"spool/{n}" for n in self.nodes)):
            (self.root / sub).mkdir()
        if len(str(self.munge_socket)) > 100:
            raise LocalSlurmError(f"path too long for a unix socket: {self.munge_socket}")
        if self._with_accounting:
            root, conf, socket = self.root / "accounting", self.root / "slurm.conf", self.munge_socket
            self.accounting = Accounting(root, slurm_conf=conf, munge_socket=socket, cluster="localslurm")
        ports = free_ports(len(self.nodes) + 1)
        self.ctld_port, self.node_ports = ports[0], dict(zip(self.nodes, ports[1:], strict=True))
        self.slurm_conf = self.root / "slurm.conf"
        (self.root / "plugstack.conf").write_text("")
        self.slurm_conf.write_text(self.render_conf())
        self.env = {"SLURM_CONF": str(self.slurm_conf), "PATH": search_path()}
        parent = find_cgroup_parent()
        if parent is None:
            raise LocalSlurmError("no writable cgroup2 mount")
        self._cgroup_root = Cgroup(parent / self.root.name).create()

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge.socket"

    def render_conf(self) -> str:
        settings = _conf.base_settings(self.root, self.ctld_port, self.munge_socket)
        settings.update(self.accounting.slurm_settings() if self.accounting is not None else {})
        if self._with_reboot:
            settings.update(_reboot.conf_settings(_reboot.write_program(self.root)))
        settings.update(self.extra_conf)
        return _conf.render(settings, self.node_ports, self.partitions, self.cpus_per_node, self.extra_nodes)

    def _env(self) -> dict[str, str]:
        return clean_env(self.env)

    def _node_env(self, name: str) -> dict[str, str]:
        return {**self._env(), _reboot.NODE_ENV: name}

    def _daemon(self, name: str, argv: list[str], stem: str) -> Daemon:
        assert self._cgroup_root is not None
        cgroup = Cgroup(self._cgroup_root.path / stem).create()
        program = find_binary(argv[0])
        if program is None:
            raise LocalSlurmError(f"{argv[0]} not found")
        full = [program, *argv[1:], "-f", str(self.slurm_conf)]
        logs = self.root / "log"
        return Daemon(name, full, logs / f"{stem}.out", logs / f"{stem}.log", cgroup)

    def _start_munged(self) -> None:
        key, run = self.root / "munge.key", self.root / "run"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        argv = [
            str(find_binary("munged")),
            "-F",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--pid-file={run}/munged.pid",
            f"--seed-file={run}/munged.seed",
            f"--log-file={self.root}/log/munged.log",
        ]
        logs = self.root / "log"
        self._munged = Daemon("munged", argv, logs / "munged.out", logs / "munged.log")
        self._munged.spawn(self._env())
        self._munged.wait_ready(self.munge_socket.exists, 10.0, "did not create its socket")

    # ----------------------------------------------------------------- clients

    def run(
        self, argv: Sequence[str], *, check: bool = False, timeout: float = 20.0, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against this cluster; text output."""
        result = subprocess.run(  # noqa: S603 - argv list, no shell
            list(argv),
            capture_output=True,
            text=True,
            env={**self._env(), **(env or {})},
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise LocalSlurmError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def node_states(self) -> dict[str, str]:
        """sinfo's long state per node: 'idle', 'down*', 'drained', 'mixed', 'idle*', ..."""
        # only the nodes with a slurmd: ``extra_nodes`` stay as defined (and are never resumed)
        argv = ["sinfo", "-h", "-N", "-n", ",".join(self.nodes), "-o", "%N %T"]
        out = self.run(argv, check=True, timeout=15).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def active_jobs(self) -> list[int]:
        """Ids of jobs that are pending, running, suspended or completing."""
        out = self.run(["squeue", "-h", "-o", "%i"], check=True, timeout=15).stdout
        return [int(j) for j in out.split()]

    @staticmethod
    def wait_for(
        predicate: Callable[[], T | None], timeout: float, *, interval: float = 0.1, message: str = "condition"
    ) -> T:
        """Poll ``predicate`` until it returns something truthy; return that. TimeoutError after."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{message} not reached within {timeout} s")
            time.sleep(interval)

    def wait_nodes_idle(self, nodes: Sequence[str] | None = None, timeout: float = 30.0) -> None:
        wanted = list(nodes or self.nodes)

        def ready() -> bool:
            for daemon in [self._ctld, *(self._slurmd[n] for n in wanted if n in self._slurmd)]:
                if daemon is not None and daemon.proc is not None and not daemon.alive:
                    raise LocalSlurmError(daemon.describe("died"))
            states = self.node_states()
            return all(states.get(n) == "idle" for n in wanted)

        try:
            self.wait_for(ready, timeout, interval=0.05, message=f"nodes {wanted} idle")
        except TimeoutError as exc:
            raise LocalSlurmError(f"{exc}; states {self.node_states()}\n{self.log_tails()}") from None

    def log_tails(self) -> str:
        daemons = [d for d in (self._ctld, *self._slurmd.values()) if d is not None]
        return "\n".join(d.describe("log") for d in daemons)

    # ----------------------------------------------------------------- fault injection

    def _node(self, name: str) -> Daemon:
        try:
            return self._slurmd[name]
        except KeyError:
            raise ValueError(f"no node {name!r} in {self.nodes}") from None

    def _node_cgroup(self, name: str) -> Cgroup:
        cgroup = self._node(name).cgroup
        assert cgroup is not None
        return cgroup

    def node_pids(self, name: str) -> list[int]:
        """Every live process of the node: its slurmd, slurmstepds and job processes."""
        return self._node_cgroup(name).pids()

    def slurmd_pid(self, name: str) -> int | None:
        return self._node(name).pid

    def crash_node(self, name: str) -> None:
        """The node dies at once: slurmd and every job process on it get SIGKILL."""
        self._node(name).kill()
        log.info("localslurm.crashed", node=name)

    def freeze_node(self, name: str) -> None:
        """The node hangs: slurmd and its jobs stop running (cgroup.freeze) but stay alive."""
        cgroup = self._node_cgroup(name)
        cgroup.freeze(True)
        self.wait_for(lambda: cgroup.frozen or not cgroup.populated, 5.0, interval=0.02, message=f"{name} frozen")
        log.info("localslurm.frozen", node=name)

    def thaw_node(self, name: str) -> None:
        self._node_cgroup(name).freeze(False)
        log.info("localslurm.thawed", node=name)

    def restart_node(self, name: str, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Start the node's slurmd again (killing whatever is left of the node first). With
        ``wait``, return once the controller sees the node responding."""
        daemon = self._node(name)
        self._node_cgroup(name).freeze(False)
        daemon.kill()
        daemon.spawn(self._node_env(name))
        log.info("localslurm.restarted", node=name)
        if wait:
            self.wait_for(
                lambda: not self.node_states().get(name, "*").endswith("*"), timeout, message=f"{name} responding"
            )

    def _reboot_node(self, name: str) -> None:
        _reboot.reboot_daemon(self._node(name), self._base_argv[name], self._node_env(name), self.boot_s)

    @property
    def reboots(self) -> list[tuple[str, float]]:
        """(node, when) of each reboot the RebootProgram asked for and the harness made."""
        return list(self._rebooter.rebooted) if self._rebooter is not None else []

    def stop_controller(self, *, kill: bool = False) -> None:
        """Stop slurmctld (SIGTERM, saving its state; SIGKILL with ``kill``). Nodes keep running."""
        assert self._ctld is not None
        self._ctld.terminate(timeout=10.0, sig=signal.SIGKILL if kill else signal.SIGTERM)
        log.info("localslurm.controller_stopped", kill=kill)

    def start_controller(self) -> None:
        """Start slurmctld (again); it recovers jobs and nodes from its state directory."""
        assert self._ctld is not None
        if self._ctld.alive:
            return
        self._ctld.spawn(self._env())
        self._ctld.wait_ready(self._ping, self.ready_timeout, "did not answer scontrol ping")

    def _ping(self) -> bool:
        return self.run(["scontrol", "ping"], timeout=10).returncode == 0

    @property
    def controller_running(self) -> bool:
        return self._ctld is not None and self._ctld.alive

    def reset(self, timeout: float = 60.0) -> None:
        """Back to a clean cluster between tests: controller up, every slurmd alive and thawed,
        no active job, every node idle (down and drained nodes resumed). Finished jobs stay
        visible in squeue for MinJobAge (300 s): tests must look only at their own job ids."""
        self.start_controller()
        for name, daemon in self._slurmd.items():
            if self._node_cgroup(name).frozen or not daemon.alive:
                self.restart_node(name, wait=False)
        jobs = self.active_jobs()
        if jobs:
            self.run(["scancel", *map(str, jobs)], timeout=15)
        self.wait_for(
            lambda: self._resume_unavailable() and not self.active_jobs(),
            timeout,
            interval=0.1,
            message="no active jobs and no unavailable node",
        )
        self.wait_nodes_idle(timeout=timeout)

    def _resume_unavailable(self) -> bool:
        """Resume responding nodes that are down or drained; True when none needed it."""
        clean = True
        for name, state in self.node_states().items():
            if state.endswith("*"):
                clean = False
            elif state.startswith(("down", "drain", "fail")):
                self.run(["scontrol", "update", f"nodename={name}", "state=resume"], timeout=15)
                clean = False
        return clean
