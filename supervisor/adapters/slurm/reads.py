"""What one snapshot asks Slurm, and in which form: the read half of the Slurm CLI adapter.

``SnapshotReader`` chooses between the ``--json`` reads and the formatted ones (``squeue_format``)
once, from ``squeue --version`` (``JSON_FILTERS_FROM``), and keeps the formatted node parser's
memory between reads. See ``slurm_cli``'s module docstring for what is read when.

Jobs named by id (``jobs(ids)``) are read the cheapest way that holds them all (measured on 22.05
with 50,000 other jobs: bench/README.md). The account's list (``squeue --user=ME``) is one client
call that slurmctld filters itself (REQUEST_JOB_USER_INFO): 24 ms, like a single ``squeue
--jobs=ID`` (REQUEST_JOB_INFO_SINGLE); two ids in one call load every job in the cluster, and
twenty calls of one id each took 190 ms. So the named jobs come from the account's list, except
where that list is not cheap: for root (``--user=root`` is not filtered by slurmctld: every job is
sent), for a reader without a user, and for an account holding many jobs of its own
(``LARGE_ACCOUNT``); there, and for a single id, each job is read by its id, a few at once.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import hostlist
import structlog

from supervisor.adapters.slurm import squeue_format as fmt
from supervisor.adapters.slurm.json_parsers import document_errors, parse_sinfo, parse_squeue
from supervisor.adapters.slurm.squeue_format import squeue_by_id_argv
from supervisor.domain.cluster import JobInfo, NodeInfo
from supervisor.ports import PermanentError, TransientError

log = structlog.get_logger()

# The first release whose --json honours squeue's and sinfo's filters (its man pages: "Sorting and
# formatting arguments ... are ignored; however, most filtering arguments are still used"; 22.05
# ignores them all, measured). Checked at run time anyway: see ``SnapshotReader._json_jobs``.
JSON_FILTERS_FROM = (24, 5)
# A node list longer than this (as a hostlist) is not worth passing: the whole table is read.
MAX_NODE_ARG = 64_000
# Reads by id run this many at once: each is a client process that mostly waits on slurmctld's job
# lock, so calls waiting together wait once.
ID_READS_AT_ONCE = 8
# An account whose last list held more jobs than this is read by id: packing them costs more.
LARGE_ACCOUNT = 1_000
# squeue's words (exit 1) for a job id slurmctld no longer holds (purged after MinJobAge).
_UNKNOWN_JOB = "invalid job id specified"


class Runner(Protocol):
    def __call__(self, argv: list[str], *, extra_env: Mapping[str, str] | None = None) -> str: ...


def squeue_json_argv(user: str | None = None) -> list[str]:
    """Every job (None) or the user's, finished ones included: from 24.05 on --json honours
    squeue's default state filter, which leaves them out (22.05 ignores --states with --json)."""
    return ["squeue", "--all", "--json", "--states=all", *([f"--user={user}"] if user else [])]


def sinfo_json_argv(nodes: str | None = None) -> list[str]:
    """--Node: one entry per node in 23.11+ (22.05 always lists nodes with --json). --Format names
    NodeAddr because 23.11+ fills ``nodes.addresses`` only when the format asks for it (without
    it the slurmd probe had only node names); the rest of each entry is the same with or without,
    and 22.05 ignores it (all measured: docs/slurm-releases.md)."""
    nodes_arg = [f"--nodes={nodes}"] if nodes else []
    return ["sinfo", "--all", "--Node", "--json", "--Format=NodeList,NodeAddr", *nodes_arg]


def version_argv() -> list[str]:
    return ["squeue", "--version"]


def parse_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from ``squeue --version`` ("slurm-wlm 22.05.8", "slurm 24.05.2")."""
    for word in text.split():
        parts = word.split(".")
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            return int(parts[0]), int(parts[1])
    return None


def own_user() -> str:
    """The account this process runs as: an instance supervises the jobs it submits itself."""
    return pwd.getpwuid(os.geteuid()).pw_name


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
        self._filters_in_json: bool | None = None if user is not None else False
        self._node_parser = fmt.NodeParser()
        self._account_jobs = 0  # how many jobs the account's last list held
        self._list_is_cheap = user is not None and not _is_root(user)  # slurmctld filters it

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
            return parse_squeue(self._json(squeue_json_argv()))
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
        names = None if wanted is True else hostlist_of(wanted)  # type: ignore[arg-type]
        if self.user is None or self._json_filters():
            return parse_sinfo(self._json(sinfo_json_argv(names)))
        seps = fmt.Separators.fresh()
        out = self._run(fmt.sinfo_argv(names, seps), extra_env=fmt.TIME_FORMAT_ENV)
        return self._node_parser.parse(out, seps, grouped=names is None)

    def _jobs_by_id(self, ids: list[int]) -> dict[int, JobInfo]:
        if len(ids) <= 1:
            return {j.job_id: j for job_id in ids for j in self._job(job_id)}
        with ThreadPoolExecutor(max_workers=min(ID_READS_AT_ONCE, len(ids))) as pool:
            return {j.job_id: j for found in pool.map(self._job, ids) for j in found}

    def _job(self, job_id: int) -> list[JobInfo]:
        """The job, or nothing when Slurm no longer holds it."""
        seps = fmt.Separators.fresh()
        try:
            out = self._run(squeue_by_id_argv(job_id, seps), extra_env=fmt.TIME_FORMAT_ENV)
        except PermanentError as exc:
            if _UNKNOWN_JOB in str(exc).lower():
                return []
            raise
        return list(fmt.parse_jobs(out, seps).values())

    def _json_filters(self) -> bool:
        """Does this Slurm's --json honour filters? Asked once (``squeue --version``)."""
        if self._filters_in_json is None:
            version = parse_version(self._run(version_argv()))
            self._filters_in_json = version is not None and version >= JSON_FILTERS_FROM
            log.info("slurm.version", version=version, json_filters=self._filters_in_json)
        return self._filters_in_json

    def _json_jobs(self, user: str) -> dict[int, JobInfo] | None:
        """The user's jobs through --json; None (and the formatted reads from now on) when the
        answer holds another user's job: this Slurm does not filter after all."""
        doc = self._json(squeue_json_argv(user))
        foreign = [
            j for j in doc.get("jobs") or () if isinstance(j, Mapping) and j.get("user_name") not in (None, user)
        ]
        if foreign:
            log.warning("slurm.json_filters_ignored", user=user, foreign_jobs=len(foreign))
            self._filters_in_json = False
            return None
        return parse_squeue(doc)

    def _json(self, argv: list[str]) -> Any:
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
