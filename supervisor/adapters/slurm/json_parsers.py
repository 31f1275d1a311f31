"""Pure parsers: ``squeue --json`` and ``sinfo --json`` documents into domain values.

Two families of shapes are understood:

* Slurm 22.05 (openapi v0.0.38): ``job_state`` is one string (flag states such as COMPLETING or
  REQUEUE_HOLD replace the base state), numbers and times are plain integers (0 = unset),
  ``exit_code`` is the raw wait status (exit 3 -> 768, SIGKILL -> 9), node ``state`` is a
  lower-case base state plus a ``state_flags`` list.
* Slurm 23.02+ (data_parser v0.0.39 and later): ``job_state`` and node ``state`` are lists (base
  state plus flags), numbers may be ``{"set": bool, "infinite": bool, "number": N}``,
  ``exit_code`` is ``{"status": [...], "return_code": N, "signal": {"id": N, "name": "..."}}``,
  ``sinfo --json`` from 23.11 on returns ``"sinfo": [...]`` entries that group nodes.

No I/O here: everything takes already-decoded JSON (``dict``) and returns frozen values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import hostlist

from supervisor.domain.cluster import JobHold, JobInfo, JobState, NodeInfo, NodeState

# Slurm's "no value" sentinels in 32-bit fields.
_NO_VAL = {0xFFFFFFFE, 0xFFFFFFFF, 0xFFFE, 0xFFFF}

# 22.05 prints a flag instead of the base state when one is set (job_state_string()).
_FLAG_STATES: Mapping[str, JobState] = {
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "SPECIAL_EXIT": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "CONFIGURING": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
    "STOPPED": JobState.RUNNING,
    "UPDATE_DB": JobState.RUNNING,
    "STAGE_OUT": JobState.COMPLETING,
    "COMPLETING": JobState.COMPLETING,
}
_HOLD_FLAGS = frozenset({"REQUEUE_HOLD", "SPECIAL_EXIT", "RESV_DEL_HOLD"})
# Slurm's wording, read here only; the domain sees JobHold and NodeInfo.prolog_failed. Reasons
# and descriptions are compared as _reason_key() makes them (lower case, words joined by "_").
_HELD_USER = "jobhelduser"
_HELD_ADMIN = "jobheldadmin"
# 22.05 after a prolog failure: state_reason JobHeldUser, state_description "launch failed
# requeued held"; other versions put it in state_reason itself.
_LAUNCH_FAILED = "launch_failed_requeued_held"
_HOLD_REASONS = frozenset({_HELD_USER, _HELD_ADMIN, _LAUNCH_FAILED})
# slurmd's reason when it drains a node whose prolog failed (22.05: "Prolog error").
_PROLOG_ERROR = "prolog error"
_BASE_JOB_STATES = frozenset(s.value for s in JobState) - {"COMPLETING", "UNKNOWN"}
_BASE_NODE_STATES = frozenset(s.value for s in NodeState) - {"UNKNOWN"}
_FAILING = frozenset({"FAIL", "FAILING"})


class ParseError(ValueError):
    """The document is not a squeue/sinfo JSON document we understand."""


# ---------------------------------------------------------------------------- scalars


def number(value: Any) -> int | None:
    """An integer from a plain number or a ``{"set", "infinite", "number"}`` object.

    None for unset, infinite, null and Slurm's NO_VAL/INFINITE sentinels.
    """
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return None if int(value) in _NO_VAL else int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def timestamp(value: Any) -> float | None:
    """Seconds since the epoch, or None (0 means unset in Slurm)."""
    n = number(value)
    return float(n) if n else None


def text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, Mapping):  # e.g. 24.x node reason {"description": ...}
        return text(value.get("description", ""))
    return str(value)


def tokens(value: Any) -> list[str]:
    """Upper-case words from a string or a list of strings."""
    if value is None:
        return []
    items = value if isinstance(value, list | tuple) else [value]
    return [str(v).strip().upper() for v in items if str(v).strip()]


def expand_nodes(value: Any) -> tuple[str, ...]:
    """Node names from a hostlist string ("n[1-3],m2") or a list of names/hostlists."""
    if not value:
        return ()
    parts = value if isinstance(value, list | tuple) else [value]
    names: list[str] = []
    for part in parts:
        part = str(part).strip()
        if not part or part == "(null)":
            continue
        try:
            names.extend(hostlist.expand_hostlist(part))
        except hostlist.BadHostlist:
            names.extend(p.strip() for p in part.split(",") if p.strip())
    return tuple(dict.fromkeys(names))


# ---------------------------------------------------------------------------- jobs


def split_job_state(value: Any) -> tuple[JobState, frozenset[str]]:
    """Base state and flags from 22.05's string or 23.02+'s list."""
    words = tokens(value)
    base = next((JobState(w) for w in words if w in _BASE_JOB_STATES), None)
    flags = frozenset(w for w in words if base is None or w != base.value)
    if base is None:
        base = next((_FLAG_STATES[w] for w in words if w in _FLAG_STATES), JobState.UNKNOWN)
    elif base is JobState.PENDING and "COMPLETING" in flags:
        # 24.11+: a requeued job still cleaning up is PENDING+COMPLETING on its old nodes, where
        # 22.05 says COMPLETING: one shape for the policy, whatever the release.
        base = JobState.COMPLETING
    return base, flags


def decode_wait_status(status: int | None) -> tuple[int | None, int | None]:
    """(exit_code, term_signal) from a raw wait status as 22.05 reports it."""
    if status is None or status < 0:
        return None, None
    signal = status & 0x7F
    if signal and signal != 0x7F:
        return None, signal
    return (status >> 8) & 0xFF, None


def decode_code_signal(value: str) -> tuple[int | None, int | None]:
    """(exit_code, term_signal) from Slurm's ``code:signal`` text: sacct's ExitCode on every release,
    and ``squeue -O exit_code`` from 24.11 on ("3:0" exit 3; "0:9" SIGKILL; 22.05 printed the raw
    wait status there). Anything but two numbers is no exit code."""
    code, sep, signal = value.partition(":")
    if not sep or not code.strip().isdigit() or not signal.strip().isdigit():
        return None, None
    if int(signal):
        return None, int(signal)
    return int(code), None


def decode_exit_code(value: Any) -> tuple[int | None, int | None]:
    """(exit_code, term_signal) from 22.05's raw wait status, 24.11+'s formatted ``code:signal`` or
    23.02+'s verbose JSON object."""
    if isinstance(value, str) and ":" in value:
        return decode_code_signal(value)
    if not isinstance(value, Mapping):
        return decode_wait_status(number(value))
    status = tokens(value.get("status"))
    signal_obj = value.get("signal")
    signal = number(signal_obj.get("id", signal_obj.get("signal_id"))) if isinstance(signal_obj, Mapping) else None
    if "SIGNALED" in status or "CORE_DUMPED" in status or (signal and not status):
        return None, signal
    if "PENDING" in status or "INVALID" in status:
        return None, None
    return number(value.get("return_code")), None


def own_outcome(state: JobState, decoded: tuple[int | None, int | None]) -> tuple[int | None, int | None]:
    """The job's own (exit_code, term_signal) of those decoded. A node failure is no code of the
    job's: Slurm fills one in (22.05 SIGTERM; 24.11+ SIGHUP in JSON and ``1:0`` in sacct), which a
    spec listing 1 as do-not-restart would have taken for the job's."""
    return (None, None) if state is JobState.NODE_FAIL else decoded


def _reason_key(text_: str) -> str:
    return "_".join(text_.lower().split())


def _is_held(job: Mapping[str, Any], state: JobState, flags: frozenset[str], reasons: tuple[str, str]) -> bool:
    """Pending and held: by a user or admin, or after a failed launch (prolog error)."""
    if state is not JobState.PENDING:
        return False
    if job.get("hold") is True or flags & _HOLD_FLAGS:
        return True
    if any(_reason_key(r) in _HOLD_REASONS for r in reasons):
        return True
    return number(job.get("priority")) == 0


def _hold(job: Mapping[str, Any], state: JobState, flags: frozenset[str], reason: str, description: str) -> JobHold:
    """Who holds the job. A launch failure wins over the reason's holder: 22.05 reports Slurm's
    own hold after a prolog error as JobHeldUser and says what happened only in the description."""
    if not _is_held(job, state, flags, (reason, description)):
        return JobHold.NONE
    if any(_LAUNCH_FAILED in _reason_key(t) for t in (description, reason)):
        return JobHold.LAUNCH_FAILED
    key = _reason_key(reason)
    if key == _HELD_ADMIN:
        return JobHold.ADMIN
    if key == _HELD_USER:
        return JobHold.USER
    return JobHold.OTHER


def parse_job(job: Mapping[str, Any]) -> JobInfo:
    state, flags = split_job_state(job.get("job_state"))
    reason = text(job.get("state_reason"))
    description = text(job.get("state_description"))
    ended = state.finished or state is JobState.COMPLETING
    exit_code, term_signal = own_outcome(state, decode_exit_code(job.get("exit_code"))) if ended else (None, None)
    job_id = number(job.get("job_id"))
    if job_id is None:
        raise ParseError(f"job without job_id: {dict(job)!r:.200}")
    return JobInfo(
        job_id=job_id,
        name=text(job.get("name")),
        state=state,
        flags=flags,
        restart_count=number(job.get("restart_cnt")) or 0,
        nodes=expand_nodes(job.get("nodes")),
        excluded_nodes=expand_nodes(job.get("excluded_nodes")),
        exit_code=exit_code,
        term_signal=term_signal,
        state_reason="" if reason == "None" else reason,
        comment=text(job.get("comment")),
        partition=text(job.get("partition")),
        hold=_hold(job, state, flags, reason, description),
        submit_time=timestamp(job.get("submit_time")),
        start_time=None if state is JobState.PENDING else timestamp(job.get("start_time")),
        end_time=timestamp(job.get("end_time")) if ended else None,
        state_description=description,
        user_id=number(job.get("user_id")),
        stdout=text(job.get("standard_output")),
        # kept by Slurm until a requeue: a job that ended in its GraceTime still shows it
        preempt_time=None if state is JobState.PENDING else timestamp(job.get("preempt_time")),
    )


def _document(doc: Any, key: str) -> list[Any]:
    if not isinstance(doc, Mapping) or not isinstance(doc.get(key), list):
        raise ParseError(f"expected a JSON object with a {key!r} list")
    items: list[Any] = doc[key]
    return items


def document_errors(doc: Mapping[str, Any]) -> list[str]:
    """Error texts a --json document carries (22.05 exits 0 with these when the controller is down)."""
    out = []
    for err in doc.get("errors") or []:
        if isinstance(err, Mapping):
            parts = [text(err.get(k)) for k in ("source", "description", "error") if err.get(k)]
            out.append(": ".join(parts) or repr(dict(err)))
        else:
            out.append(str(err))
    return out


def parse_squeue(doc: Mapping[str, Any]) -> dict[int, JobInfo]:
    """All jobs of a ``squeue --json`` document, by job id (array/het jobs as their own ids)."""
    jobs = (parse_job(j) for j in _document(doc, "jobs"))
    return {j.job_id: j for j in jobs}


# ---------------------------------------------------------------------------- nodes


def split_node_state(state: Any, flags: Any = None) -> tuple[NodeState, frozenset[str]]:
    """Base state and flags from 22.05's ``state`` + ``state_flags`` or 23.02+'s list."""
    words = tokens(state) + tokens(flags)
    words = [w for part in words for w in part.replace("+", " ").split()]
    base = next((NodeState(w) for w in words if w in _BASE_NODE_STATES), NodeState.UNKNOWN)
    return base, frozenset(w for w in words if w != base.value)


def prolog_error(reason: str) -> bool:
    """Slurm took the node out because a job's prolog failed there (22.05: \"Prolog error\")."""
    return reason.lower().startswith(_PROLOG_ERROR)


def node_reason(state: NodeState, flags: frozenset[str], reason: str) -> str:
    """The reason of a node out of service; "" for one in service. 24.11 keeps a node's reason after
    ``scontrol update state=resume`` (22.05 and 26.05 clear it): a healthy node read there would
    carry its last drain's words into the logbook."""
    probe = NodeInfo(name="", state=state, flags=flags)
    return reason if not probe.schedulable or flags & _FAILING else ""


def _node_from_record(rec: Mapping[str, Any]) -> NodeInfo:
    state, flags = split_node_state(rec.get("state"), rec.get("state_flags"))
    reason = node_reason(state, flags, text(rec.get("reason")))
    return NodeInfo(
        name=text(rec.get("name")),
        state=state,
        flags=flags,
        reason=reason,
        partitions=tuple(text(p) for p in rec.get("partitions") or ()),
        address=text(rec.get("address")),
        port=number(rec.get("port")),
        prolog_failed=prolog_error(reason),
    )


def _nodes_from_group(entry: Mapping[str, Any]) -> list[NodeInfo]:
    """23.11+ ``sinfo`` entry: one state for a group of nodes (per node with ``sinfo -N``)."""
    group = entry.get("nodes") or {}
    names = expand_nodes(group.get("nodes"))
    addresses = list(group.get("addresses") or ())
    state, flags = split_node_state((entry.get("node") or {}).get("state"))
    partition = text((entry.get("partition") or {}).get("name"))
    reason = node_reason(state, flags, text(entry.get("reason")))
    return [
        NodeInfo(
            name=name,
            state=state,
            flags=flags,
            reason=reason,
            partitions=(partition,) if partition else (),
            address=text(addresses[i]) if len(addresses) == len(names) else "",
            port=number(entry.get("port")) if len(names) == 1 else None,
            prolog_failed=prolog_error(reason),
        )
        for i, name in enumerate(names)
    ]


def _merge(nodes: Iterable[NodeInfo]) -> dict[str, NodeInfo]:
    """One NodeInfo per name; a node listed once per partition gets all its partitions."""
    out: dict[str, NodeInfo] = {}
    for node in nodes:
        seen = out.get(node.name)
        if seen is not None:
            parts = tuple(dict.fromkeys(seen.partitions + node.partitions))
            node = replace(seen, partitions=parts)
        out[node.name] = node
    return out


def parse_sinfo(doc: Mapping[str, Any]) -> dict[str, NodeInfo]:
    """All nodes of a ``sinfo --json`` (or ``scontrol show nodes --json``) document, by name."""
    if isinstance(doc, Mapping) and isinstance(doc.get("sinfo"), list):
        return _merge(n for entry in doc["sinfo"] for n in _nodes_from_group(entry))
    return _merge(_node_from_record(rec) for rec in _document(doc, "nodes"))
