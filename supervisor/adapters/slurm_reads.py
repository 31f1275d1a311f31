"""What one snapshot asks Slurm, and in which form: the read half of the Slurm CLI adapter.

``SnapshotReader`` chooses between the ``--json`` reads and the formatted ones (``squeue_format``)
once, from ``squeue --version`` (``JSON_FILTERS_FROM``), and keeps the formatted node parser's
memory between reads. See ``slurm_cli``'s module docstring for what is read when.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Collection, Mapping
from typing import Any, Protocol

import hostlist
import structlog

from supervisor.adapters import squeue_format as fmt
from supervisor.adapters.slurm_json import document_errors, parse_sinfo, parse_squeue
from supervisor.domain.cluster import JobInfo, NodeInfo
from supervisor.ports import TransientError

log = structlog.get_logger()

# The first release whose --json honours squeue's and sinfo's filters (its man pages: "Sorting and
# formatting arguments ... are ignored; however, most filtering arguments are still used"; 22.05
# ignores them all, measured). Checked at run time anyway: see ``SnapshotReader._json_jobs``.
JSON_FILTERS_FROM = (24, 5)
# A node list longer than this (as a hostlist) is not worth passing: the whole table is read.
MAX_NODE_ARG = 64_000


class Runner(Protocol):
    def __call__(self, argv: list[str], *, extra_env: Mapping[str, str] | None = None) -> str: ...


def squeue_json_argv(user: str | None = None) -> list[str]:
    if user is None:
        return ["squeue", "--all", "--json"]
    return ["squeue", "--all", "--json", "--states=all", f"--user={user}"]


def sinfo_json_argv(nodes: str | None = None) -> list[str]:
    # --Node: one entry per node in 23.11+ (22.05 always lists nodes with --json).
    return ["sinfo", "--all", "--Node", "--json", *([f"--nodes={nodes}"] if nodes else [])]


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

    def jobs(self) -> dict[int, JobInfo]:
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
