"""The Scheduler port over Slurm's command-line clients (squeue, sinfo, sbatch, scontrol, scancel).

Three layers, each small: argv builders (pure, below), parsers (pure, ``slurm_json``), and one
runner (``SlurmCli._run``) that executes an argv with a timeout and maps failures onto the port's
errors through ``classify``. One ``snapshot`` runs one ``squeue --json`` (one controller RPC,
REQUEST_JOB_INFO) and, unless ``include_nodes`` is False, one ``sinfo --json`` (two RPCs in 22.05:
REQUEST_NODE_INFO and REQUEST_PARTITION_INFO, measured with sdiag). Slurm 22.05 ignores
``-j``/``-u``/``-t`` with ``--json``, so the snapshot holds every job and the engine filters.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

import hostlist
import structlog

from supervisor.adapters.slurm_config import parse_show_config, show_config_argv
from supervisor.adapters.slurm_json import (
    ParseError,
    document_errors,
    parse_sinfo,
    parse_squeue,
)
from supervisor.domain.cluster import ClusterSnapshot, NodeChange, SubmitRequest
from supervisor.ports import PermanentError, PermissionDenied, PortError, TransientError

log = structlog.get_logger()

DEFAULT_NODE_REASON = "slurm-supervisor"

_PERMISSION = (
    "access/permission denied",
    "permission denied",
    "access denied",
    "not authorized",
)
_TRANSIENT = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "connection timed out",
    "connection reset",
    "connect failure",
    "zero bytes were transmitted",
    "communication connection failure",
    "unexpected message received",
    "backup controller in standby",
    "resource temporarily unavailable",
    "temporarily unable",
    "slurmctld is busy",
    "network is unreachable",
    "no route to host",
    "transport endpoint",
    "munge encode failed",
    "munge decode failed",
    "protocol authentication error",
)
# Cancelling a job that already ended (or was purged) is fine.
_ALREADY_ENDED = ("already completing or completed", "invalid job id", "job has already finished")


# ---------------------------------------------------------------------------- error mapping


def classify(returncode: int, stderr: str, command: str = "slurm") -> PortError | None:
    """The port error for a finished client call, or None when it succeeded.

    Permission problems -> PermissionDenied; controller unreachable, socket errors, munge
    trouble, death by signal -> TransientError; anything else non-zero -> PermanentError.
    """
    if returncode == 0:
        return None
    message = " ".join(stderr.split()) or "(no error output)"
    lowered = message.lower()
    detail = f"{command} exited {returncode}: {message}"
    if any(p in lowered for p in _PERMISSION):
        return PermissionDenied(detail)
    if returncode < 0 or any(p in lowered for p in _TRANSIENT):
        return TransientError(detail)
    return PermanentError(detail)


def already_ended(error: PortError) -> bool:
    return not isinstance(error, TransientError) and any(p in str(error).lower() for p in _ALREADY_ENDED)


# ---------------------------------------------------------------------------- argv builders


def compress(nodes: Sequence[str]) -> str:
    """A compact hostlist ("n[1-3,7]") for a list of node names."""
    return hostlist.collect_hostlist(list(nodes)) if nodes else ""


def squeue_argv() -> list[str]:
    return ["squeue", "--all", "--json"]


def sinfo_argv() -> list[str]:
    # --Node: one entry per node in 23.11+ (22.05 always lists nodes with --json).
    return ["sinfo", "--all", "--Node", "--json"]


def sbatch_argv(request: SubmitRequest) -> list[str]:
    """sbatch argv for a request. Its env travels in the process environment (``--export=ALL``),
    so values may hold commas, quotes and newlines."""
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={request.job_name}",
        f"--partition={request.partition}",
        f"--nodes={request.nodes}",
        f"--comment={request.comment}",
        "--requeue" if request.requeue else "--no-requeue",
        "--export=ALL",
    ]
    if request.exclude:
        argv.append(f"--exclude={compress(request.exclude)}")
    if request.output:
        argv += [f"--output={request.output}", "--open-mode=append"]
    if request.workdir:
        argv.append(f"--chdir={request.workdir}")
    argv += list(request.extra_args)
    argv.append(request.script)
    return argv


def parse_sbatch_output(stdout: str) -> int:
    """Job id from ``sbatch --parsable`` ("123" or "123;cluster")."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    head = line.split(";", 1)[0].strip()
    if not head.isdigit():
        raise PermanentError(f"sbatch printed no job id: {stdout.strip()!r}")
    return int(head)


def requeue_argv(job_id: int, *, hold: bool = False) -> list[str]:
    return ["scontrol", "requeuehold" if hold else "requeue", str(job_id)]


def hold_argv(job_id: int) -> list[str]:
    return ["scontrol", "hold", str(job_id)]


def release_argv(job_id: int) -> list[str]:
    return ["scontrol", "release", str(job_id)]


def cancel_argv(job_id: int) -> list[str]:
    return ["scancel", str(job_id)]


def exclude_argv(job_id: int, nodes: Sequence[str]) -> list[str]:
    return ["scontrol", "update", f"jobid={job_id}", f"excnodelist={compress(nodes)}"]


def node_state_argv(node: str, change: NodeChange, reason: str) -> list[str]:
    argv = ["scontrol", "update", f"nodename={node}", f"state={change.value}"]
    if change is not NodeChange.RESUME:
        # Slurm refuses DOWN/DRAIN without a reason; one argv element, spaces are fine.
        argv.append(f"reason={' '.join(reason.split()) or DEFAULT_NODE_REASON}")
    return argv


_SECRET_PREFIXES = ("AWS_", "BOTO_", "SLURM_SUPERVISOR_")


def client_env(
    base: Mapping[str, str], extra: Mapping[str, str] | None = None, slurm_conf: str | None = None
) -> dict[str, str]:
    """Environment for a client call: ``base`` without inherited SLURM_* job variables (they
    would leak into submitted jobs) and without the daemon's own secrets (its S3 credentials must
    not reach every job through sbatch's --export=ALL), then ``extra``, then SLURM_CONF."""
    env = {
        k: v
        for k, v in base.items()
        if (not k.startswith("SLURM_") or k == "SLURM_CONF") and not k.startswith(_SECRET_PREFIXES)
    }
    env.update(extra or {})
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return env


# ---------------------------------------------------------------------------- the adapter


class SlurmCli:
    """Scheduler implemented with Slurm's CLI. Thread-compatible (no shared mutable state)."""

    def __init__(
        self,
        *,
        bin_dir: str | None = None,
        slurm_conf: str | None = None,
        timeout: float = 20.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.bin_dir = bin_dir
        self.slurm_conf = slurm_conf
        self.timeout = timeout
        self.env = dict(env or {})

    # -- runner

    def _program(self, name: str) -> str:
        return os.path.join(self.bin_dir, name) if self.bin_dir else name

    def _run(self, argv: Sequence[str], *, job_env: Mapping[str, str] | None = None) -> str:
        """Run one client; return its stdout or raise the mapped port error."""
        full = [self._program(argv[0]), *argv[1:]]
        env = client_env(os.environ, {**self.env, **(job_env or {})}, self.slurm_conf)
        log.debug("slurm.call", argv=list(argv), env_keys=sorted(job_env or {}))
        started = time.monotonic()
        try:
            proc = subprocess.run(  # noqa: S603 - argv list, no shell
                full, capture_output=True, text=True, env=env, timeout=self.timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise TransientError(f"{argv[0]} timed out after {self.timeout:g} s") from exc
        except OSError as exc:
            raise PermanentError(f"cannot run {full[0]}: {exc}") from exc
        error = classify(proc.returncode, proc.stderr, argv[0])
        if error is not None:
            log.debug("slurm.failed", argv=list(argv), error=str(error))
            raise error
        log.debug("slurm.done", command=argv[0], seconds=round(time.monotonic() - started, 3))
        return proc.stdout

    def _json(self, argv: Sequence[str]) -> Any:
        out = self._run(argv)
        try:
            doc = json.loads(out)
        except ValueError as exc:
            raise TransientError(f"{argv[0]} printed no valid JSON ({len(out)} bytes)") from exc
        errors = document_errors(doc) if isinstance(doc, Mapping) else []
        if errors:
            # 22.05 exits 0 with an "errors" list and no jobs when the controller is down.
            raise TransientError(f"{argv[0]} --json reported: {'; '.join(errors)}")
        return doc

    # -- Scheduler

    def snapshot(self, include_nodes: bool = True) -> ClusterSnapshot:
        taken_at = time.time()
        jobs_doc = self._json(squeue_argv())
        nodes_doc = self._json(sinfo_argv()) if include_nodes else None
        try:
            jobs = parse_squeue(jobs_doc)
            nodes = parse_sinfo(nodes_doc) if nodes_doc is not None else {}
        except (ParseError, TypeError, ValueError, AttributeError) as exc:
            raise PermanentError(f"unexpected squeue/sinfo JSON: {exc}") from exc
        return ClusterSnapshot(taken_at=taken_at, jobs=jobs, nodes=nodes)

    def test_submit(self, request: SubmitRequest) -> None:
        """``sbatch --test-only``: Slurm checks the job (partition, GRES, node count, limits)
        without submitting it; PermanentError with Slurm's words when it would refuse it."""
        self._run([*sbatch_argv(request)[:-1], "--test-only", request.script], job_env=request.env)

    def submit(self, request: SubmitRequest) -> int:
        job_id = parse_sbatch_output(self._run(sbatch_argv(request), job_env=request.env))
        log.debug("slurm.submitted", job_id=job_id, run=request.run, comment=request.comment)
        return job_id

    def requeue(self, job_id: int, *, hold: bool = False) -> None:
        self._run(requeue_argv(job_id, hold=hold))

    def hold(self, job_id: int) -> None:
        self._run(hold_argv(job_id))

    def release(self, job_id: int) -> None:
        self._run(release_argv(job_id))

    def cancel(self, job_id: int) -> None:
        try:
            self._run(cancel_argv(job_id))
        except PortError as exc:
            if not already_ended(exc):
                raise
            log.debug("slurm.cancel_ended", job_id=job_id, error=str(exc))

    def set_excluded(self, job_id: int, nodes: Sequence[str]) -> None:
        self._run(exclude_argv(job_id, nodes))

    def show_config(self) -> dict[str, str]:
        """Slurm's running configuration (``scontrol show config``), parsed."""
        return parse_show_config(self._run(show_config_argv()))

    def set_node_state(self, node: str, change: NodeChange, reason: str) -> None:
        self._run(node_state_argv(node, change, reason))
