"""Slurm's formatted text output, for the filtered reads 22.05's ``--json`` cannot make.

Slurm 22.05 ignores every filter with ``--json`` (``squeue --json -u me`` prints every job of every
user; ``sinfo --json -n n1`` every node: bench/README.md), so the daemon's own jobs and a list of
nodes are read with ``squeue -O`` / ``sinfo -O`` instead, whose filters 22.05 honours (``squeue -u``
is even filtered by slurmctld: REQUEST_JOB_USER_INFO).

Delimiter safety: names, comments, reasons and paths may hold any character, commas, tabs and
newlines included. Every call picks a random separator (``Separators.fresh``) that ends each field,
and a different one that ends each record; a record must split into exactly the expected fields or
the whole answer is refused (ParseError). A job cannot have chosen its text to match a separator
drawn after it was written.

The fields are mapped onto the keys of the ``--json`` documents so that one interpretation
(``slurm_json.parse_job``, ``split_node_state``) serves both paths.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from supervisor.adapters.slurm.json_parsers import (
    ParseError,
    expand_nodes,
    node_reason,
    number,
    parse_job,
    prolog_error,
    split_node_state,
    text,
)
from supervisor.domain.cluster import JobInfo, NodeInfo

# squeue -O field -> the key of the same value in a 22.05 ``squeue --json`` job. Times come as
# epoch seconds (SLURM_TIME_FORMAT=%s in the client's environment); exit_code is the raw wait
# status like the JSON's; Reason is the state description when Slurm has one, else the reason.
JOB_FIELDS: tuple[tuple[str, str], ...] = (
    ("JobID", "job_id"),
    ("UserID", "user_id"),
    ("State", "job_state"),
    ("Reason", "state_reason"),
    ("PriorityLong", "priority"),
    ("RestartCnt", "restart_cnt"),
    ("exit_code", "exit_code"),
    ("SubmitTime", "submit_time"),
    ("StartTime", "start_time"),
    ("EndTime", "end_time"),
    ("Partition", "partition"),
    ("NodeList", "nodes"),
    ("ExcNodes", "excluded_nodes"),
    ("Name", "name"),
    ("Comment", "comment"),
    ("STDOUT", "standard_output"),
    ("PreemptTime", "preempt_time"),  # set while a preempted job runs out its GraceTime
)
# sinfo -N -O field -> the key in a 22.05 ``sinfo --json`` node.
NODE_FIELDS: tuple[tuple[str, str], ...] = (
    ("NodeList", "name"),
    ("StateComplete", "state"),
    ("PartitionName", "partitions"),
    ("NodeAddr", "address"),
    ("Port", "port"),
    ("Reason", "reason"),
)
# The whole table, grouped by sinfo (no --Node, no per-node address or port: sinfo -N sorts its
# lines into groups one by one, 12.7 s for 10,000 nodes here, against 0.45 s grouped).
GROUP_FIELDS: tuple[tuple[str, str], ...] = (
    ("NodeList", "name"),
    ("StateComplete", "state"),
    ("PartitionName", "partitions"),
    ("Reason", "reason"),
)
TIME_FORMAT_ENV = {"SLURM_TIME_FORMAT": "%s"}  # times as epoch seconds, whatever the site's locale
_UNSET = frozenset({"(null)", "N/A", "n/a", "Unknown", "None", "none"})


@dataclass(frozen=True)
class Separators:
    """What ends a field and what ends a record in one answer: never seen in a job's own text."""

    field: str
    record: str

    @classmethod
    def fresh(cls) -> Separators:
        token = secrets.token_hex(8)
        return cls(f"\x1f{token}\x1f", f"\x1e{token}\x1e")

    def format(self, fields: tuple[tuple[str, str], ...]) -> str:
        """An ``-O`` format: every field unpadded (size 0), ended by the field separator, the
        last by the record separator. No separator holds a comma (``-O``'s list delimiter)."""
        names = [name for name, _ in fields]
        return ",".join(f"{name}:0{self.field}" for name in names[:-1]) + f",{names[-1]}:0{self.record}"


def squeue_argv(user: str, seps: Separators) -> list[str]:
    """The daemon's own jobs, in every state Slurm still holds (finished ones too, like --json)."""
    fields = f"--Format={seps.format(JOB_FIELDS)}"
    return ["squeue", "--noheader", "--all", "--local", "--states=all", f"--user={user}", fields]


def squeue_by_id_argv(job_id: int, seps: Separators) -> list[str]:
    """One job by its id, in any state. One id only: 22.05's squeue then asks slurmctld for that job
    alone (REQUEST_JOB_INFO_SINGLE); with two or more it loads every job in the cluster (measured)."""
    fields = f"--Format={seps.format(JOB_FIELDS)}"
    return ["squeue", "--noheader", "--all", "--local", "--states=all", f"--jobs={job_id}", fields]


def sinfo_argv(nodes: str | None, seps: Separators) -> list[str]:
    """One line per node and partition of ``nodes`` (a hostlist); for every node (None), one line
    per group of nodes alike (``GROUP_FIELDS``)."""
    if nodes is None:
        return ["sinfo", "--noheader", "--all", f"--Format={seps.format(GROUP_FIELDS)}"]
    return ["sinfo", "--noheader", "--all", "--Node", f"--nodes={nodes}", f"--Format={seps.format(NODE_FIELDS)}"]


def records(out: str, seps: Separators, fields: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
    """The answer's records as {json key: raw text}. ParseError when any record does not split into
    exactly the expected fields (a separator inside a value, a truncated answer)."""
    chunks = out.split(seps.record)
    if chunks[-1].strip():
        raise ParseError(f"formatted answer ends inside a record: {chunks[-1][:80]!r}")
    keys = [key for _, key in fields]
    rows = []
    for i, chunk in enumerate(chunks[:-1]):
        values = (chunk[1:] if i and chunk.startswith("\n") else chunk).split(seps.field)
        if len(values) != len(keys):
            raise ParseError(f"formatted record {i} has {len(values)} fields, not {len(keys)}")
        rows.append(dict(zip(keys, values, strict=True)))
    return rows


def _value(raw: str) -> str | None:
    return None if raw in _UNSET else raw


def job_record(row: Mapping[str, str]) -> dict[str, Any]:
    """A formatted job line in the shape of a 22.05 --json job."""
    job: dict[str, Any] = {key: _value(raw) for key, raw in row.items()}
    job["state_reason"] = row["state_reason"]
    job["comment"] = "" if row["comment"] == "(null)" else row["comment"]
    job["name"] = row["name"]
    return job


def parse_jobs(out: str, seps: Separators, fields: tuple[tuple[str, str], ...] = JOB_FIELDS) -> dict[int, JobInfo]:
    """``fields``: what the answer was asked for (an older capture asked for fewer)."""
    jobs = (parse_job(job_record(row)) for row in records(out, seps, fields))
    return {j.job_id: j for j in jobs}


class NodeParser:
    """Formatted node lines into NodeInfo, keeping the value of every line seen last time: a node
    whose line did not change is not rebuilt (O(changed) per read, whatever the node count)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, ...], NodeInfo] = {}

    def parse(self, out: str, seps: Separators, *, grouped: bool = False) -> dict[str, NodeInfo]:
        """``grouped``: the answer of the whole-table read (``GROUP_FIELDS``, a hostlist a line)."""
        seen: dict[tuple[str, ...], NodeInfo] = {}
        nodes: dict[str, NodeInfo] = {}
        for row in records(out, seps, GROUP_FIELDS if grouped else NODE_FIELDS):
            for name in expand_nodes(row["name"]) if grouped else (row["name"],):
                line = (name, *row.values())
                info = self._seen.get(line) or seen.get(line) or _node({**row, "name": name})
                seen[line] = info
                nodes[name] = _add_partitions(nodes.get(name), info)
        self._seen = seen
        return nodes


def _node(row: Mapping[str, str]) -> NodeInfo:
    state, flags = split_node_state(row["state"])
    reason = node_reason(state, flags, "" if row["reason"] in _UNSET else row["reason"])
    partition = text(row["partitions"])
    return NodeInfo(
        name=row["name"],
        state=state,
        flags=flags,
        reason=reason,
        partitions=(partition,) if partition and partition not in _UNSET else (),
        address=text(_value(row.get("address", ""))),
        port=number(row.get("port")),
        prolog_failed=prolog_error(reason),
    )


def _add_partitions(seen: NodeInfo | None, node: NodeInfo) -> NodeInfo:
    """A node listed once per partition gets all its partitions (sinfo -N prints one line each)."""
    if seen is None:
        return node
    return replace(seen, partitions=tuple(dict.fromkeys(seen.partitions + node.partitions)))
