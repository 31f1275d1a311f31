"""The Scheduler port over Slurm's command-line clients (squeue, sinfo, sbatch, scontrol, scancel).

Three layers, each small: argv builders (pure, below and in ``squeue_format``), parsers (pure,
``slurm_json`` and ``squeue_format``), and one runner (``SlurmCli._run``) that executes an argv
with a timeout and maps failures onto the port's errors through ``classify``.

What a ``snapshot`` reads depends on ``user``, the account whose jobs the instance supervises:

* ``user=None`` (the node guard, tools): every job (``squeue --all --json``) and, with nodes, every
  node (``sinfo --all --Node --json``) — one REQUEST_JOB_INFO, plus REQUEST_NODE_INFO and
  REQUEST_PARTITION_INFO (measured with sdiag).
* ``user`` set (the daemon): that user's jobs only, and only the nodes asked for (``include_nodes``
  a set of names) or all of them (``True``). ``snapshot_of`` reads only the jobs named: from the
  account's filtered list, or where that is not cheap (root's) one ``squeue --jobs=ID`` each
  (REQUEST_JOB_INFO_SINGLE: slurmctld looks up that job alone); see ``slurm_reads``. Slurm 22.05 ignores every filter with ``--json``
  (bench/README.md), so below ``release.JSON_FILTERS_FROM`` the reads are ``squeue -u USER -O ...`` (which
  slurmctld itself filters: REQUEST_JOB_USER_INFO) and ``sinfo -N -n NODES -O ...``, parsed by
  ``squeue_format``; from that version on the ``--json`` reads carry the same filters. A JSON answer
  that still holds another user's job switches the adapter to the formatted reads for good.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO

import hostlist
import structlog

from supervisor.adapters.slurm.config import parse_show_config, show_config_argv
from supervisor.adapters.slurm.json_parsers import ParseError
from supervisor.adapters.slurm.reads import SnapshotReader
from supervisor.adapters.slurm.release import SlurmRelease
from supervisor.domain.cluster import ClusterSnapshot, NodeChange, SubmitRequest
from supervisor.domain.text_safety import printable
from supervisor.ports import PermanentError, PermissionDenied, PortError, TransientError

log = structlog.get_logger()

DEFAULT_NODE_REASON = "slurm-supervisor"

_PERMISSION = (
    "access/permission denied",
    "permission denied",
    "access denied",
    "not authorized",
    "invalid user id",  # 22.05: scontrol update of a node by a user without AdminLevel Admin
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


def sbatch_argv(request: SubmitRequest, export_file: str | None = None) -> list[str]:
    """sbatch argv for a request. Its env reaches the job only, through ``--export-file`` (NUL-
    separated NAME=value, read by sbatch from ``export_file``, a file or an inherited fd, and the
    job's whole environment then: see ``SlurmCli._sbatch``), so values may hold commas, quotes and
    newlines and none of them steers the sbatch client itself."""
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
    if export_file is not None:
        argv.append(f"--export-file={export_file}")
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
        # Slurm refuses DOWN/DRAIN without a reason; one argv element, spaces are fine. No control
        # character reaches it: sinfo and scontrol print the reason to people's terminals.
        argv.append(f"reason={' '.join(printable(reason).split()) or DEFAULT_NODE_REASON}")
    return argv


_SECRET_PREFIXES = ("AWS_", "BOTO_", "SLURM_SUPERVISOR_")


def client_env(
    base: Mapping[str, str],
    extra: Mapping[str, str] | None = None,
    slurm_conf: str | None = None,
    job_keys: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """Environment for a client call: ``base`` without inherited SLURM_* job variables (they
    would leak into submitted jobs) and without the daemon's own secrets (its S3 credentials must
    not reach every job through sbatch's --export=ALL), then ``extra`` (the daemon's own settings,
    never a run spec's), then SLURM_CONF. ``job_keys``, the names the job's --export-file sets, are
    left out so that the job gets the run's values, not the daemon's."""
    env = {
        k: v
        for k, v in base.items()
        if (not k.startswith("SLURM_") or k == "SLURM_CONF") and not k.startswith(_SECRET_PREFIXES)
    }
    env.update(extra or {})
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return {k: v for k, v in env.items() if k not in job_keys}


def export_file_text(job_env: Mapping[str, str]) -> bytes:
    """The job's variables as sbatch's --export-file reads them: NAME=value, NUL-separated."""
    for name, value in job_env.items():
        if not name or "=" in name or "\0" in name + value:
            raise PermanentError(f"the job's variable {name[:40]!r} cannot be exported (an '=' or a NUL)")
    return b"".join(f"{name}={value}".encode() + b"\0" for name, value in job_env.items())


CLIENTS = ("squeue", "sinfo", "sbatch", "scontrol", "scancel")


def resolve_clients(bin_dir: str | None, search_path: str | None) -> dict[str, str | None]:
    """Each Slurm client's absolute path: in ``bin_dir``, else found on ``search_path`` (the
    daemon's own PATH); None for one not found. Resolved once, so nothing a run sets can choose them."""
    if bin_dir:
        return {name: os.path.join(os.path.abspath(bin_dir), name) for name in CLIENTS}
    found = {name: shutil.which(name, path=search_path or os.defpath) for name in CLIENTS}
    return {name: os.path.abspath(path) if path else None for name, path in found.items()}


@contextmanager
def _export_fd(job_env: Mapping[str, str] | None) -> Iterator[IO[bytes] | None]:
    """An unlinked temporary file holding the job's variables, rewound for sbatch to read."""
    if not job_env:
        yield None
        return
    with tempfile.TemporaryFile() as file:
        file.write(export_file_text(job_env))
        file.flush()
        file.seek(0)
        yield file


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
        user: str | None = None,
    ) -> None:
        self.bin_dir = bin_dir
        self.slurm_conf = slurm_conf
        self.timeout = timeout
        self.env = dict(env or {})
        self.programs = resolve_clients(bin_dir, self.env.get("PATH", os.environ.get("PATH")))
        self.user = user  # whose jobs a snapshot reads; None: every user's (see the module's doc)
        self.bytes_read: Counter[str] = Counter()  # stdout bytes per client, for benchmarks
        self._counting = threading.Lock()  # reads by id run in threads
        self._reader = SnapshotReader(self._run, user)

    # -- runner

    def _program(self, name: str) -> str:
        path = self.programs.get(name)
        if path is None:
            raise PermanentError(f"cannot run {name}: not found on the daemon's PATH at start (set [slurm] bin_dir)")
        return path

    def _run(
        self,
        argv: Sequence[str],
        *,
        job_keys: frozenset[str] = frozenset(),
        fds: tuple[int, ...] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> str:
        """Run one client; return its stdout or raise the mapped port error. ``fds`` are inherited
        by the client (the job's --export-file); ``job_keys`` are kept out of its environment;
        ``extra_env`` are the client's own settings (SLURM_TIME_FORMAT)."""
        full = [self._program(argv[0]), *argv[1:]]
        env = {**client_env(os.environ, self.env, self.slurm_conf, job_keys), **(extra_env or {})}
        log.debug("slurm.call", argv=list(argv), job_env_keys=sorted(job_keys))
        started = time.monotonic()
        try:
            proc = subprocess.run(  # noqa: S603 - argv list, no shell
                full, capture_output=True, text=True, env=env, timeout=self.timeout, check=False, pass_fds=fds
            )
        except subprocess.TimeoutExpired as exc:
            raise TransientError(f"{argv[0]} timed out after {self.timeout:g} s") from exc
        except OSError as exc:
            raise PermanentError(f"cannot run {full[0]}: {exc}") from exc
        error = classify(proc.returncode, proc.stderr, argv[0])
        if error is not None:
            log.debug("slurm.failed", argv=list(argv), error=str(error))
            raise error
        with self._counting:
            self.bytes_read[argv[0]] += len(proc.stdout)
        seconds = round(time.monotonic() - started, 3)
        log.debug("slurm.done", command=argv[0], seconds=seconds, bytes=len(proc.stdout))
        return proc.stdout

    # -- Scheduler

    def slurm_release(self) -> SlurmRelease:
        """The running Slurm release and what it gives (asked once: ``squeue --version``)."""
        return self._reader.release()

    def snapshot(self, include_nodes: bool | Collection[str] = True) -> ClusterSnapshot:
        """Jobs (the ``user``'s, or everyone's) and nodes: none (False), all (True), or at least
        those named (a set of names; the answer may hold more)."""
        return self.snapshot_of(None, include_nodes)

    def snapshot_of(self, jobs: Collection[int] | None, include_nodes: bool | Collection[str]) -> ClusterSnapshot:
        """As ``snapshot``, with only the jobs named (those Slurm still holds); None: every job."""
        taken_at = time.time()
        try:
            found = self._reader.jobs(jobs)
            nodes = self._reader.nodes(include_nodes)
        except (ParseError, TypeError, ValueError, AttributeError, KeyError) as exc:
            raise PermanentError(f"unexpected squeue/sinfo answer: {exc}") from exc
        return ClusterSnapshot(taken_at=taken_at, jobs=found, nodes=nodes)

    def test_submit(self, request: SubmitRequest) -> None:
        """``sbatch --test-only``: Slurm checks the job (partition, GRES, node count, limits)
        without submitting it; PermanentError with Slurm's words when it would refuse it."""
        self._sbatch(request, test_only=True)

    def submit(self, request: SubmitRequest) -> int:
        job_id = parse_sbatch_output(self._sbatch(request))
        log.debug("slurm.submitted", job_id=job_id, run=request.run, comment=request.comment)
        return job_id

    def _sbatch(self, request: SubmitRequest, *, test_only: bool = False) -> str:
        """sbatch with the job's environment in an inherited file descriptor (--export-file). sbatch
        22.05 gives a job with --export-file only that file's variables (and SLURM_*), so the file
        holds what --export=ALL would have given (the client's environment) with the run's over it."""
        job_env = {**client_env(os.environ, self.env, self.slurm_conf), **request.env} if request.env else {}
        with _export_fd(job_env) as export:
            fd = export.fileno() if export is not None else None
            argv = sbatch_argv(request, None if fd is None else str(fd))
            if test_only:
                argv = [*argv[:-1], "--test-only", argv[-1]]
            fds = () if fd is None else (fd,)
            return self._run(argv, job_keys=frozenset(request.env), fds=fds)

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
