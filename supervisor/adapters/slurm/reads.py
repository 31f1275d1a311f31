"""What one snapshot asks Slurm, and in which form: the read half of the Slurm CLI adapter.

``SnapshotReader`` asks ``squeue --version`` once and lets the release (``release.SlurmRelease``)
choose between the ``--json`` reads and the formatted ones (``squeue_format``); it logs once what
the release lacks, and keeps the formatted node parser's memory between reads. See ``cli``'s
module docstring for what is read when.

Jobs named by id (``jobs(ids)``) are read the cheapest way that holds them all (measured on 22.05
with 50,000 other jobs: bench/README.md). The account's list (``squeue --user=ME``) is one client
call that slurmctld filters itself (REQUEST_JOB_USER_INFO): 24 ms, like a single ``squeue
--jobs=ID`` (REQUEST_JOB_INFO_SINGLE); two ids in one call load every job in the cluster, and
twenty calls of one id each took 190 ms. So the named jobs come from the account's list, except
where that list is not cheap: for root (``--user=root`` is not filtered by slurmctld: every job is
sent), for a reader without a user, and for an account holding many jobs of its own
(``LARGE_ACCOUNT``); there, and for a single id, each job is read by its id, a few at once — as
JSON where the release filters it (one RPC: the formatted squeue loads the partition table too).

Every squeue asks ``--local``: without it a read by id first loads the federation's description
(REQUEST_FED_INFO, one more RPC each tick on every release; measured with sdiag). The supervisor
follows jobs on the cluster it submits to.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import hostlist
import structlog

from supervisor.adapters.slurm import squeue_format as fmt
from supervisor.adapters.slurm.json_parsers import document_errors, parse_sinfo, parse_squeue
from supervisor.adapters.slurm.release import SlurmRelease, parse_version
from supervisor.adapters.slurm.squeue_format import squeue_by_id_argv
from supervisor.domain.cluster import JobInfo, NodeInfo
from supervisor.domain.observation import account_label
from supervisor.ports import PermanentError, TransientError

log = structlog.get_logger()

# A node list longer than this (as a hostlist) is not worth passing: the whole table is read.
MAX_NODE_ARG = 64_000
# Reads by id run this many at once: each is a client process that mostly waits on slurmctld's job
# lock, so calls waiting together wait once.
ID_READS_AT_ONCE = 8
# An account whose last list held more jobs than this is read by id: packing them costs more.
LARGE_ACCOUNT = 1_000
# squeue's words (exit 1) for a job id slurmctld no longer holds (purged after MinJobAge).
_UNKNOWN_JOB = "invalid job id specified"
# What a client prints when it lacks the data_parser asked for (a release that dropped v0.0.42).
_NO_PARSER = "unable to find plugin"


class Runner(Protocol):
    def __call__(self, argv: list[str], *, extra_env: Mapping[str, str] | None = None) -> str: ...


def squeue_json_argv(user: str | None = None, *, job: int | None = None, json_flag: str = "--json") -> list[str]:
    """Every job (None), the user's, or one by id, finished ones included: from 24.05 on --json
    honours squeue's default state filter, which leaves them out (22.05 ignores --states there)."""
    scope = [f"--jobs={job}"] if job is not None else [f"--user={user}"] if user else []
    return ["squeue", "--all", "--local", json_flag, "--states=all", *scope]


def sinfo_json_argv(nodes: str | None = None, *, json_flag: str = "--json") -> list[str]:
    """--Node: one entry per node in 23.11+ (22.05 always lists nodes with --json). --Format names
    NodeAddr because 23.11+ fills ``nodes.addresses`` only when the format asks for it (without
    it the slurmd probe had only node names); the rest of each entry is the same with or without,
    and 22.05 ignores it (all measured: docs/slurm-releases.md)."""
    nodes_arg = [f"--nodes={nodes}"] if nodes else []
    return ["sinfo", "--all", "--Node", json_flag, "--Format=NodeList,NodeAddr", *nodes_arg]


def version_argv() -> list[str]:
    return ["squeue", "--version"]


def own_user() -> str:
    """The account this process runs as: an instance supervises the jobs it submits itself."""
    return pwd.getpwuid(os.geteuid()).pw_name


def own_account() -> str:
    """This process's account as node reasons name it (issue 32, finding 12); the guard names its
    caller the same way, from the kernel's UID."""
    uid = os.geteuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = ""
    return account_label(name, uid)


def _is_root(user: str) -> bool:
    try:
        return pwd.getpwnam(user).pw_uid == 0
    except KeyError:
        return False


def hostlist_of(nodes: Collection[str]) -> str | None:
    """A compact hostlist for ``nodes``; None when it would be too long to pass as an argument."""
    names = hostlist.collect_hostlist(sorted(nodes))
    return names if len(names) <= MAX_NODE_ARG else None


class SnapshotReader:
    def __init__(self, run: Runner, user: str | None) -> None:
        self._run = run
        self.user = user
        self._release: SlurmRelease | None = None
        self._json_trusted = True  # False once a JSON answer held another user's job
        self._pinned_parser = True  # False once this Slurm lacked the pinned data_parser
        self._node_parser = fmt.NodeParser()
        self._account_jobs = 0  # how many jobs the account's last list held
        self._list_is_cheap = user is not None and not _is_root(user)  # slurmctld filters it

    def release(self) -> SlurmRelease:
        """The running Slurm, asked once (``squeue --version``); what it lacks is logged then."""
        if self._release is None:
            self._release = SlurmRelease(parse_version(self._run(version_argv())))
            log.info(
                "slurm.release",
                version=self._release.version,
                json_filters=self._release.json_filters,
                data_parser=self._release.data_parser,
                lacks=self._release.lacks(),
            )
        return self._release

    def jobs(self, ids: Collection[int] | None = None) -> dict[int, JobInfo]:
        """The jobs named (``ids``: those Slurm still holds), or every job the reader is scoped to
        (None: the user's, or everyone's)."""
        if ids is not None and not self._by_list(ids):
            return self._jobs_by_id(sorted(ids))
        jobs = self._account()
        self._account_jobs = len(jobs)
        return jobs if ids is None else {i: jobs[i] for i in ids if i in jobs}

    def _by_list(self, ids: Collection[int]) -> bool:
        """Are the named jobs cheaper to take from the account's list than to read one by one?"""
        return len(ids) > 1 and self._list_is_cheap and self._account_jobs <= LARGE_ACCOUNT

    def _account(self) -> dict[int, JobInfo]:
        if self.user is None:
            return parse_squeue(self._json(lambda flag: squeue_json_argv(json_flag=flag)))
        if self._json_filters():
            jobs = self._json_jobs(self.user)
            if jobs is not None:
                return jobs
        seps = fmt.Separators.fresh()
        return fmt.parse_jobs(self._run(fmt.squeue_argv(self.user, seps), extra_env=fmt.TIME_FORMAT_ENV), seps)

    def nodes(self, wanted: bool | Collection[str]) -> dict[str, NodeInfo]:
        """None (False), all (True) or at least the named nodes (an empty collection: none)."""
        if wanted is False or (wanted is not True and not wanted):
            return {}
        names = None if wanted is True else hostlist_of(wanted)
        if self.user is None or self._json_filters():
            return parse_sinfo(self._json(lambda flag: sinfo_json_argv(names, json_flag=flag)))
        seps = fmt.Separators.fresh()
        out = self._run(fmt.sinfo_argv(names, seps), extra_env=fmt.TIME_FORMAT_ENV)
        return self._node_parser.parse(out, seps, grouped=names is None)

    def _jobs_by_id(self, ids: list[int]) -> dict[int, JobInfo]:
        read = self._json_job if ids and self._json_filters() else self._formatted_job
        if len(ids) <= 1:
            return {j.job_id: j for job_id in ids for j in read(job_id)}
        with ThreadPoolExecutor(max_workers=min(ID_READS_AT_ONCE, len(ids))) as pool:
            return {j.job_id: j for found in pool.map(read, ids) for j in found}

    def _formatted_job(self, job_id: int) -> list[JobInfo]:
        """The job, or nothing when Slurm no longer holds it."""
        seps = fmt.Separators.fresh()
        try:
            out = self._run(squeue_by_id_argv(job_id, seps), extra_env=fmt.TIME_FORMAT_ENV)
        except PermanentError as exc:
            if _UNKNOWN_JOB in str(exc).lower():
                return []
            raise
        return list(fmt.parse_jobs(out, seps).values())

    def _json_job(self, job_id: int) -> list[JobInfo]:
        """The job as JSON (24.05+ filters it: one REQUEST_JOB_INFO_SINGLE, where the formatted
        read also loads the partition table), or nothing when Slurm no longer holds it."""
        try:
            doc = self._json(lambda flag: squeue_json_argv(job=job_id, json_flag=flag))
        except (PermanentError, TransientError) as exc:
            if _UNKNOWN_JOB in str(exc).lower():
                return []
            raise
        return [job for job in parse_squeue(doc).values() if job.job_id == job_id]

    def _json_filters(self) -> bool:
        """Does this Slurm's --json honour filters (and has it not been caught ignoring them)?"""
        return self._json_trusted and self.release().json_filters

    def _json_jobs(self, user: str) -> dict[int, JobInfo] | None:
        """The user's jobs through --json; None (and the formatted reads from now on) when the
        answer holds another user's job: this Slurm does not filter after all."""
        doc = self._json(lambda flag: squeue_json_argv(user, json_flag=flag))
        foreign = [
            j for j in doc.get("jobs") or () if isinstance(j, Mapping) and j.get("user_name") not in (None, user)
        ]
        if foreign:
            log.warning("slurm.json_filters_ignored", user=user, foreign_jobs=len(foreign))
            self._json_trusted = False
            return None
        return parse_squeue(doc)

    def _json_flag(self) -> str:
        return self.release().json_flag() if self._pinned_parser else "--json"

    def _json(self, argv_for: Callable[[str], list[str]]) -> Any:
        """The JSON document of ``argv_for(--json flag)``. A Slurm without the pinned data_parser
        (a release that dropped it) is asked again with its default, and from then on."""
        flag = self._json_flag()
        try:
            return self._document(argv_for(flag))
        except PermanentError as exc:
            if flag == "--json" or _NO_PARSER not in str(exc).lower():
                raise
            log.warning("slurm.data_parser_missing", asked=flag, error=str(exc)[:200])
            self._pinned_parser = False
            return self._document(argv_for("--json"))

    def _document(self, argv: list[str]) -> Any:
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
