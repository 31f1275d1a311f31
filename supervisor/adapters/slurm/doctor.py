"""``slurm-supervisor doctor``: the adapter's reads run against a site's own Slurm, and what came back
that the supervisor could not use (docs/slurm-releases.md, "Checking your own Slurm").

Each check is one read the daemon makes, as the daemon makes it (its account, the same argv and
parsers), and says ``ok``, ``warn`` (the supervisor works, with less: e.g. no node address, so dead
nodes are seen only after Slurm's SlurmdTimeout) or ``fail`` (a read the daemon needs does not work).
Nothing is submitted, changed or cancelled.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.adapters.slurm.json_parsers import ParseError
from supervisor.adapters.slurm.sacct import SacctCli
from supervisor.domain.cluster import JobInfo, JobState
from supervisor.domain.text_safety import printable
from supervisor.ports import PortError

# Nodes whose names are looked up to tell whether the probe can reach slurmd by name.
NAMES_TRIED = 3
# Finished states that always carry the job's own exit code or signal.
_OWN_OUTCOME = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.OUT_OF_MEMORY})

Resolver = Callable[[str], object]


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str


def _resolve(name: str) -> object:
    return socket.getaddrinfo(name, None)


def check_slurm(cli: SlurmCli, accounting: SacctCli | None = None, resolve: Resolver = _resolve) -> list[Check]:
    """Every check, in the order the daemon's first tick would meet them."""
    checks = [_release(cli)]
    jobs, check = _read("account's jobs", lambda: cli.snapshot(include_nodes=False).jobs)
    checks.append(check)
    if jobs:
        checks.append(_by_id(cli, max(jobs)))
    checks.extend(_nodes(cli, resolve))
    if accounting is not None and jobs:
        checks.append(_accounting(accounting, max(jobs)))
    return checks


def _release(cli: SlurmCli) -> Check:
    try:
        release = cli.slurm_release()
    except PortError as exc:
        return Check("release", Status.FAIL, f"squeue --version: {exc}")
    if release.version is None:
        return Check("release", Status.WARN, "squeue --version gave no version: the oldest read forms are used")
    major, minor = release.version
    said = f"Slurm {major}.{minor:02d}; JSON reads {'filtered' if release.json_filters else 'unfiltered (formatted reads)'}"
    said += f"; data_parser {release.data_parser or 'the default'}"
    lacks = release.lacks()
    return Check("release", Status.OK, said + (f"; lacks {', '.join(lacks)}" if lacks else ""))


def _read(name: str, read: Callable[[], Mapping[int, JobInfo]]) -> tuple[Mapping[int, JobInfo], Check]:
    try:
        jobs = read()
    except (PortError, ParseError) as exc:
        return {}, Check(name, Status.FAIL, printable(str(exc))[:300])
    return jobs, Check(name, Status.OK, f"{len(jobs)} job(s) read")


def _by_id(cli: SlurmCli, job_id: int) -> Check:
    """The read a daemon with one run makes every tick; 24.11+ lost exit codes there (fixed)."""
    try:
        job = cli.snapshot_of(frozenset({job_id}), False).jobs.get(job_id)
    except (PortError, ParseError) as exc:
        return Check("a job by id", Status.FAIL, printable(str(exc))[:300])
    if job is None:
        return Check("a job by id", Status.WARN, f"job {job_id} left Slurm between two reads")
    if job.state in _OWN_OUTCOME and job.exit_code is None and job.term_signal is None:
        return Check("a job by id", Status.FAIL, f"job {job_id} ended {job.state} with no exit code or signal read")
    outcome = "" if not job.state.finished else f", exit code {job.exit_code}, signal {job.term_signal}"
    return Check("a job by id", Status.OK, f"job {job_id}: {job.state}{outcome}")


def _nodes(cli: SlurmCli, resolve: Resolver) -> list[Check]:
    try:
        nodes = cli.snapshot_of(frozenset(), True).nodes
        named = cli.snapshot_of(frozenset(), frozenset(sorted(nodes)[:NAMES_TRIED])).nodes if nodes else {}
    except (PortError, ParseError) as exc:
        return [Check("nodes", Status.FAIL, printable(str(exc))[:300])]
    checks = [Check("nodes", Status.OK if nodes else Status.WARN, f"{len(nodes)} node(s) read")]
    if not named:
        return checks
    if all(n.address for n in named.values()):
        checks.append(Check("node addresses", Status.OK, "slurmd's address read for the nodes in focus"))
        return checks
    unresolved = [n for n in named if not _resolves(n, resolve)]
    status = Status.WARN if unresolved else Status.OK
    detail = "no NodeAddr read: the slurmd probe connects to node names"
    if unresolved:
        detail += f", and {', '.join(unresolved)} resolve nowhere: dead nodes are seen only after SlurmdTimeout"
    checks.append(Check("node addresses", status, detail))
    return checks


def _resolves(name: str, resolve: Resolver) -> bool:
    try:
        resolve(name)
    except OSError:
        return False
    return True


def _accounting(accounting: SacctCli, job_id: int) -> Check:
    try:
        found = accounting.job_records([job_id])
    except PortError as exc:
        return Check("accounting", Status.WARN, f"sacct: {printable(str(exc))[:300]} (jobs squeue forgot stay unknown)")
    return Check("accounting", Status.OK, f"sacct knows job {job_id}" if found else f"sacct has no job {job_id} yet")
