"""Run the real ``slurm-supervisor`` daemon as a process against a LocalSlurm, for tests and benchmarks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisor.testing.slurm.localslurm import LocalSlurm

CLI = [sys.executable, "-m", "supervisor"]


class SupervisorProcess:
    """A daemon config in ``workdir``, the daemon started as a subprocess, and the CLI beside it."""

    def __init__(
        self,
        cluster: LocalSlurm,
        workdir: Path,
        *,
        poll_interval_s: float = 0.5,
        probe: bool = True,
        may_change_nodes: bool = True,
        extra: str = "",
        ingest_port: int = 0,
        hook_token_file: Path | None = None,
        ingest_extra: str = "",
        command_timeout_s: float = 5.0,
    ) -> None:
        self.cluster = cluster
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.workdir / "state"
        self.config = self.workdir / "supervisor.toml"
        hook_line = f'hook_token_file = "{hook_token_file}"\n' if hook_token_file else ""
        self.config.write_text(
            f'[daemon]\nstate_dir = "{self.state_dir}"\npoll_interval_s = {poll_interval_s}\n'
            f"may_change_nodes = {'true' if may_change_nodes else 'false'}\n"
            f'[slurm]\nslurm_conf = "{cluster.slurm_conf}"\ncommand_timeout_s = {command_timeout_s}\n'
            f"[probe]\nenabled = {'true' if probe else 'false'}\ntimeout_s = 1.0\nconfirm_after_s = 1.0\n"
            f'[ingest]\nbind = "127.0.0.1"\nport = {ingest_port}\n{hook_line}{ingest_extra}'
            f'[logging]\nlevel = "info"\nformat = "json"\n{extra}'
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, **self.cluster.env}

    @property
    def log_path(self) -> Path:
        return self.workdir / f"daemon-{self.starts}.log"

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*CLI, "--config", str(self.config), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"slurm-supervisor {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done

    def start(self, *extra_args: str, env: Mapping[str, str] | None = None) -> SupervisorProcess:
        self.starts += 1
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [*CLI, "--config", str(self.config), "daemon", *extra_args],
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        self.wait_api()
        return self

    def wait_api(self, timeout: float = 30.0) -> None:
        """Until the daemon's local API accepts connections (the CLI's changes go through it) or the
        daemon exits."""
        deadline = time.monotonic() + timeout
        while self.proc is not None and self.proc.poll() is None and not _accepts(self.state_dir / "api.sock"):
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the daemon's API did not answer within {timeout} s:\n{self.log_path.read_text()[-3000:]}"
                )
            time.sleep(0.05)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(5)
        self.proc = None
        return rc

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        rc = self.proc.wait(timeout)
        self.proc = None
        return rc

    def status(self, run: str) -> dict[str, Any]:
        data = json.loads(self.cli("status", run, "--json").stdout)
        return data[0]  # type: ignore[no-any-return]

    def logbook(self, run: str) -> list[dict[str, Any]]:
        out = self.cli("logbook", run, "--json").stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def log_lines(self) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        for i in range(1, self.starts + 1):
            path = self.workdir / f"daemon-{i}.log"
            for raw in path.read_text(errors="replace").splitlines():
                try:
                    lines.append(json.loads(raw))
                except json.JSONDecodeError:
                    lines.append({"event": "raw", "text": raw})
        return lines

    def wait_ended(self, run: str, timeout: float) -> dict[str, Any]:
        """Wait until ``run`` ends (completed, failed or cancelled); its last status."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self.status(run)
            if status["state"] in ("completed", "failed", "cancelled"):
                return status
            time.sleep(0.2)
        raise AssertionError(f"run {run} did not end within {timeout} s; last status {status}")

    def wait_running(
        self, run: str, *, attempt: int = 0, avoid: Sequence[str] = (), timeout: float = 60.0, interval: float = 0.1
    ) -> dict[str, Any]:
        """Wait until the run's attempt ``attempt`` is running on nodes not in ``avoid``."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            last = self.status(run)
            nodes = last["running_on"]
            if last["state"] == "running" and last["attempt"] == attempt and nodes and not set(nodes) & set(avoid):
                return last
            time.sleep(interval)
        raise AssertionError(f"run {run} attempt {attempt} not running within {timeout} s; last status {last}")


def _accepts(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def write_run(
    workdir: Path,
    name: str,
    *,
    nodes: int,
    partition: str,
    spares: str | None = None,
    script_body: str,
    env: Mapping[str, str] | None = None,
    max_restarts: int = 5,
) -> Path:
    """A batch script and a run spec for it; returns the spec's path."""
    script = workdir / f"{name}.sbatch"
    script.write_text("#!/bin/bash\n" + script_body)
    script.chmod(0o755)
    env_line = ", ".join(f'{k} = "{v}"' for k, v in (env or {}).items())
    spares_block = f'[spares]\npolicy = "named"\nnodes = "{spares}"\n' if spares else ""
    spec = workdir / f"{name}.toml"
    spec.write_text(
        f'[run]\nname = "{name}"\nscript = "{script.name}"\npartition = "{partition}"\nnodes = {nodes}\n'
        f'output = "{name}-%j.out"\nenv = {{ {env_line} }}\n{spares_block}'
        f"[restart]\nmax_restarts = {max_restarts}\n"
    )
    return spec


def spared_run(
    cluster: LocalSlurm,
    workdir: Path,
    *,
    script_body: str,
    env: Mapping[str, str] | None = None,
    name: str = "llm",
    max_restarts: int = 5,
) -> Path:
    """The tests' usual run on a LocalSlurm (``write_run``): two nodes of its partition, its last node
    the named spare; returns the spec's path."""
    spares = cluster.nodes[-1]
    return write_run(
        workdir, name, nodes=2, partition=cluster.partition, spares=spares, script_body=script_body, env=env,
        max_restarts=max_restarts,
    )  # fmt: skip
