"""Causes of interruptions, in the terms of Llama 3 405B's Table 5 where the evidence names one.

Table 5 (``../shared/data/failure_tables/llama3_405b_table5_*``) sorts 419 unexpected interruptions
into GPU, Host, Network, Dependency, Unplanned Maintenance and Unknown, by component. A fault's
message and evidence are matched against the components' words (node names removed first, so
``gpu-117`` is not a GPU fault); what they do not name gets a category of ours, flagged as outside
the table, rather than a guess.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.domain.records import Event, EventKind


@dataclass(frozen=True)
class Cause:
    """What interrupted the run, in Llama 3 Table 5's terms where it maps (``table5``)."""

    category: str
    component: str | None
    table5: bool
    basis: str  # the words in the evidence that decided it, or why nothing did


PREEMPTED = Cause("Preempted", None, False, "Slurm preempted the job for a higher-priority one; not in Table 5")

# (pattern over the fault's message and evidence, category, Table 5 component); first match wins.
_RULES: tuple[tuple[str, str, str | None], ...] = (
    (r"\bsilent data corruption\b|\bsdc\b", "GPU", "Silent Data Corruption"),
    (r"\bxid ?(48|63|64|92|94|95)\b|\becc\b|\bhbm|row.?remap|retired page", "GPU", "GPU HBM3 Memory"),
    (r"\bsram\b", "GPU", "GPU SRAM Memory"),
    (r"\bgsp\b|system processor|\bxid ?(119|120)\b", "GPU", "GPU System Processor"),
    (r"thermal|temperature|overheat", "GPU", "GPU Thermal Interface + Sensor"),
    (r"\bxid\b|\bgpu\b|nvml|fallen off the bus|nvlink", "GPU", "Faulty GPU"),
    (r"\bnic\b|\bhca\b|mlx\d|infiniband port|ib port", "Host", "NIC"),
    (r"switch|cable|fabric|network|link down|\bib\b", "Network", "Network Switch/Cable"),
    (r"maintenance|firmware", "Unplanned Maintenance", "Host Maintenance"),
    (r"\bssd\b|nvme|\bdisk\b", "Host", "SSD"),
    (r"power supply|\bpsu\b", "Host", "Power Supply"),
    (r"\bcpu\b|machine check|\bmce\b", "Host", "CPU"),
    (r"dimm|system memory|\boom\b|out of memory", "Host", "System Memory"),
    (r"nccl|watchdog|collective", "Unknown", "NCCL Watchdog Timeouts"),
    (r"segfault|segmentation fault|traceback|exception|software bug", "Dependency", "Software Bug"),
)


def classify(events: Sequence[Event]) -> Cause:
    """The cause of an interruption from its opening events (faults first)."""
    ordered = sorted(events, key=lambda e: (e.kind is not EventKind.FAULT, e.at))
    first_kind = ordered[0].kind
    if first_kind in (EventKind.FAULT, EventKind.REQUEUED) and ordered[0].evidence.get("state") == "PREEMPTED":
        return PREEMPTED  # not a failure: Slurm gave the nodes to a higher-priority job
    text = " ".join(_words(e) for e in ordered).lower()
    for pattern, category, component in _RULES:
        m = re.search(pattern, text)
        if m:
            return Cause(category, component, True, f"evidence says {m.group(0)!r}")
    first = ordered[0]
    ev = first.evidence
    if first.kind.value == "rollback" or any(e.kind.value == "rollback" for e in ordered):
        return Cause("Loss spike (rollback)", None, False, "a rollback after a loss spike; not in Table 5")
    if "last_step" in ev or "silent_s" in ev or first.kind.value == "hang":
        return Cause("Hang (no progress)", None, False, "the job stopped making steps; no cause on record")
    if ev.get("node") or first.kind.value == "mass_fault":
        return Cause(
            "Node lost (cause not seen)", None, False, "the node stopped answering; nothing on record says why"
        )
    if first.kind is EventKind.REQUEUED:
        return Cause("Slurm requeue (cause not seen)", None, False, "Slurm requeued the job; no fault on record")
    return Cause("Job failure (cause not seen)", None, False, "the job ended badly; no cause on record")


def _words(e: Event) -> str:
    """The event's message and telling evidence, without node names (``gpu-117`` is not a GPU fault)."""
    ev = e.evidence
    text = " ".join(
        [e.message]
        + [str(ev[k]) for k in ("observed", "reason", "rule", "probe", "xid", "category") if ev.get(k) is not None]
    )
    nodes = [ev["node"]] if isinstance(ev.get("node"), str) else []
    listed = ev.get("nodes")
    nodes += [n for n in listed if isinstance(n, str)] if isinstance(listed, list | tuple) else []
    for node in sorted(nodes, key=len, reverse=True):
        text = text.replace(node, " ")
    return text
