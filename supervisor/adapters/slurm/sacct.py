"""The Accounting port over ``sacct`` (Slurm's job accounting, kept by slurmdbd).

squeue forgets a finished job MinJobAge after it ended (300 s by default); a daemon stopped longer
than that finds the jobs it followed gone. Accounting keeps them: ``SacctCli.job_records`` asks
for all of them in one ``sacct`` call.

Same three layers as ``slurm_cli``: an argv builder, a pure parser, and the runner (``SlurmCli``'s,
with its error mapping). The parser reads ``sacct --parsable2`` with fixed fields and epoch times
(``SLURM_TIME_FORMAT=%s``), not ``sacct --json``: in 22.05 the JSON reports every exit code as 0
(a job that ran ``exit 3`` shows ``"return_code": 0`` beside state FAILED — captured in
tests/data/slurm/sacct_2205.json), and the exit code is what ``do_not_restart_exit_codes``
reads. The ``|``-separated fields have kept their names and meaning across Slurm releases.

``--duplicates`` lists every incarnation of a requeued job (one record per start, the earlier ones
REQUEUED): the last record is the job's outcome and the records before it its restart count.

A job cancelled by hand reads "CANCELLED by UID" in State: the only place Slurm 22.05 names who
cancelled a job (squeue and scontrol do not; docs/operations.md). ``cancelled_by`` reads the UID
strictly; ``job_records`` names it from the account database (``account_name``, validated).
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from supervisor.adapters.slurm.cli import SlurmCli
from supervisor.adapters.slurm.json_parsers import ParseError, decode_code_signal, expand_nodes, own_outcome
from supervisor.domain.cluster import Canceller, JobInfo, JobState
from supervisor.ports import PermanentError

# The fields read, in this order; Comment last (it may hold "|" — the parser keeps the rest whole).
FIELDS = (
    "JobIDRaw",
    "JobName",
    "State",
    "ExitCode",
    "Reason",
    "NodeList",
    "Partition",
    "Submit",
    "Start",
    "End",
    "UID",
    "Comment",
)
SACCT_ENV: Mapping[str, str] = {"SLURM_TIME_FORMAT": "%s"}  # times as seconds since the epoch
_UNSET_TIMES = frozenset({"", "Unknown", "None", "0"})
_DISABLED = "accounting storage is disabled"  # sacct's words on a cluster without accounting
_CANCELLED_BY = re.compile(r"CANCELLED by (0|[1-9][0-9]{0,9})")  # ASCII digits as Slurm writes them
_STATE_MAX = 64  # a State longer than this is no state sacct writes
UID_MAX = 2**32 - 2  # (uid_t)-1 means "no user"
# A plain account name (POSIX portable characters, useradd's default rule; at most 32): anything
# else from the account database (a directory service) is not printed as a person's name.
_ACCOUNT_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.$-]{0,31}")


def new_separator() -> str:
    """A field separator no job can put in its name or comment: random per call, as the squeue
    reads do (``--parsable2`` does not escape ``|``; a job may rename itself; issue 32, finding 13)."""
    return f"#{secrets.token_hex(8)}#"


def sacct_argv(job_ids: Iterable[int], separator: str = "|") -> list[str]:
    """One ``sacct`` call for ``job_ids``: their allocations only (no steps), every user's (the
    daemon's own jobs whatever PrivateData says), every incarnation of a requeued job; fields
    separated by ``separator``."""
    ids = ",".join(str(j) for j in sorted(set(job_ids)))
    return [
        "sacct",
        f"--jobs={ids}",
        "--allocations",
        "--duplicates",
        "--allusers",
        "--parsable2",
        "--noheader",
        f"--delimiter={separator}",
        f"--format={','.join(FIELDS)}",
    ]


# ---------------------------------------------------------------------------- parser


def _time(value: str) -> float | None:
    value = value.strip()
    if value in _UNSET_TIMES:
        return None
    if not value.isdigit():
        raise ParseError(f"time {value!r} is not in seconds (SLURM_TIME_FORMAT=%s not applied?)")
    return float(value)


def _state(value: str) -> JobState:
    """Base state from sacct's wording: "CANCELLED by 1000" -> CANCELLED; REQUEUED -> PENDING."""
    word = value.split()[0].upper() if value.split() else ""
    if word in ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        return JobState.PENDING
    return JobState.parse(word)


def cancelled_by(state: str) -> int | None:
    """The UID in sacct's "CANCELLED by UID"; None for any other state, or one that is not exactly
    that (a hostile or truncated text names no one)."""
    if len(state) > _STATE_MAX:
        return None
    match = _CANCELLED_BY.fullmatch(state.strip(" "))
    uid = int(match.group(1)) if match else None
    return uid if uid is not None and uid <= UID_MAX else None


def account_name(uid: int, lookup: Callable[[int], Any] = pwd.getpwuid) -> str:
    """``uid``'s account name on this host; "" when unknown here or not a plain account name."""
    try:
        name = lookup(uid).pw_name
    except (KeyError, OverflowError, ValueError):
        return ""
    return name if isinstance(name, str) and _ACCOUNT_NAME.fullmatch(name) else ""


def parse_record(line: str, separator: str = "|") -> JobInfo:
    parts = line.split(separator, len(FIELDS) - 1)
    if len(parts) != len(FIELDS):
        raise ParseError(f"sacct line with {len(parts)} fields, expected {len(FIELDS)}: {line!r:.200}")
    f = dict(zip(FIELDS, parts, strict=True))
    if not f["JobIDRaw"].isdigit():
        raise ParseError(f"sacct line without a job id: {line!r:.200}")
    state = _state(f["State"])
    exit_code, term_signal = own_outcome(state, decode_code_signal(f["ExitCode"])) if state.finished else (None, None)
    reason = f["Reason"].strip()
    nodes = () if f["NodeList"] in ("None assigned", "") else expand_nodes(f["NodeList"])
    return JobInfo(
        job_id=int(f["JobIDRaw"]),
        name=f["JobName"],
        state=state,
        nodes=nodes,
        exit_code=exit_code,
        term_signal=term_signal,
        state_reason="" if reason == "None" else reason,
        comment=f["Comment"],
        partition=f["Partition"],
        submit_time=_time(f["Submit"]),
        start_time=_time(f["Start"]) if nodes else None,  # a job cancelled while pending: its cancel time
        end_time=_time(f["End"]) if state.finished else None,
        user_id=int(f["UID"]) if f["UID"].isdigit() else None,
        cancelled_by=_canceller(f["State"]),
    )


def _canceller(state: str) -> Canceller | None:
    uid = cancelled_by(state)
    return None if uid is None else Canceller(uid)


def parse_sacct(stdout: str, separator: str = "|") -> dict[int, JobInfo]:
    """Each job's latest record (its outcome once it ended), with ``restart_count`` the number of
    incarnations before it (each requeued incarnation has a record of its own, submitted anew)."""
    records: dict[int, list[JobInfo]] = {}
    for line in stdout.splitlines():
        if line.strip():
            record = parse_record(line, separator)
            records.setdefault(record.job_id, []).append(record)
    return {job_id: _latest(rs) for job_id, rs in records.items()}


def _latest(records: list[JobInfo]) -> JobInfo:
    ordered = sorted(records, key=lambda r: (r.submit_time or 0.0, r.start_time or 0.0))  # stable
    return replace(ordered[-1], restart_count=len(ordered) - 1)


# ---------------------------------------------------------------------------- the adapter


class SacctCli(SlurmCli):
    """Accounting implemented with ``sacct``; shares ``SlurmCli``'s runner and error mapping
    (slurmdbd unreachable -> TransientError). Construct it like ``SlurmCli``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.env = {**self.env, **SACCT_ENV}
        self.programs = {**self.programs, "sacct": self._find("sacct")}

    def _find(self, name: str) -> str | None:
        """Like the other clients: in ``bin_dir``, else on the daemon's PATH, resolved once."""
        if self.bin_dir:
            return os.path.join(os.path.abspath(self.bin_dir), name)
        found = shutil.which(name, path=self.env.get("PATH", os.environ.get("PATH")) or os.defpath)
        return os.path.abspath(found) if found else None

    def job_records(self, job_ids: Iterable[int]) -> dict[int, JobInfo]:
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        try:
            separator = new_separator()
            out = self._run(sacct_argv(ids, separator))
        except PermanentError as exc:
            if _DISABLED in str(exc).lower():
                raise PermanentError(
                    "the cluster keeps no job accounting (accounting_storage/none: no slurmdbd)"
                ) from exc
            raise
        try:
            found = parse_sacct(out, separator)
        except ParseError as exc:
            raise PermanentError(f"unexpected sacct output: {exc}") from exc
        return {j: _named(found[j]) for j in ids if j in found}


def _named(job: JobInfo) -> JobInfo:
    """The record with its canceller's account name (the host's account database)."""
    if job.cancelled_by is None:
        return job
    return replace(job, cancelled_by=Canceller(job.cancelled_by.uid, account_name(job.cancelled_by.uid)))
