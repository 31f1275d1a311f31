"""What a decision sees and may do: one tick's ``Observation``, the ``Policy`` it decides under,
and the helpers every part of the decision shares (logbook lines, the reason the supervisor puts
on a node it changes). Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from supervisor.domain.actions import (
    Decision,
    SetState,
)
from supervisor.domain.cluster import ClusterSnapshot
from supervisor.domain.health.findings import NodeFinding
from supervisor.domain.health.quarantine import Quarantine
from supervisor.domain.hostnames import fold
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.domain.run import RunState
from supervisor.domain.spikes.rollback import RollbackRecord

REASON_PREFIX = "slurm-supervisor"
# An account name as a node reason shows it: passwd's usual shapes (LDAP's dots and '@' too), never
# a ':' or '/' that would let one account's reason read as another's (issue 32, finding 12).
_ACCOUNT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._@$-]{0,31}$")


@dataclass(frozen=True)
class Forgotten:
    """A job of ours that Slurm's controller no longer lists (it ended longer than MinJobAge
    ago, e.g. while the daemon was stopped), and what accounting (sacct) said of it. ``found``:
    accounting's record is in the snapshot's jobs, decided on as if squeue still showed it.
    Otherwise ``why`` says why its outcome is unknown, and ``final`` whether asking again is
    pointless (no accounting, no record) or may tell (slurmdbd unreachable, record not yet written)."""

    why: str
    found: bool = False
    final: bool = True


@dataclass(frozen=True)
class SavedCheckpoint:
    """A run's newest verified checkpoint, as a planned end is judged on it (domain.decide.continuation)."""

    location: str
    step: int | None
    at: float  # when it was written (its newest object)


@dataclass(frozen=True)
class UncheckedSave:
    """A save that could not be checked when its job ended: a committed checkpoint newer than the
    newest verified one that storage would not let be read (``step`` known), or a root that could
    not be listed (``step`` None). "Unverifiable" is not "corrupt": a planned end waits on it."""

    reason: str
    step: int | None = None
    location: str | None = None


@dataclass(frozen=True)
class Observation:
    """One tick's view: Slurm's snapshot plus nodes that direct probes confirmed dead."""

    snapshot: ClusterSnapshot
    dead: Mapping[str, str] = field(default_factory=dict)  # node -> evidence
    # node -> when the first sign of its death was seen (its first failed probe): a fault's onset
    dead_since: Mapping[str, float] = field(default_factory=dict)
    hangs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # run -> hang evidence
    findings: Mapping[str, NodeFinding] = field(default_factory=dict)  # node -> worst active finding
    quarantined: Mapping[str, Quarantine] = field(default_factory=dict)  # nodes every run keeps out
    checkpoint_at: Mapping[str, float] = field(default_factory=dict)  # run -> newest verified checkpoint
    rollbacks: Mapping[str, RollbackRecord] = field(default_factory=dict)  # run -> rollback planned, not yet done
    # nodes kept out of a run that Slurm took out of service (we, a health check or an admin) and
    # someone returned to service since
    returned: frozenset[str] = frozenset()
    agents: frozenset[str] = frozenset()  # nodes whose node agent reports (fresh heartbeat)
    history: Mapping[str, tuple[AttemptRecord, ...]] = field(default_factory=dict)  # run -> newest attempts
    # run -> (when, error) of submissions Slurm refused for good since its current attempt began
    refused: Mapping[str, tuple[tuple[float, str], ...]] = field(default_factory=dict)
    forgotten: Mapping[int, Forgotten] = field(default_factory=dict)  # job id -> what accounting said
    # run -> its newest verified checkpoint, for runs whose job has ended (verified before deciding)
    saved: Mapping[str, SavedCheckpoint] = field(default_factory=dict)
    # run -> a newer save storage would not let be checked, for the same runs (a planned end waits)
    unchecked: Mapping[str, UncheckedSave] = field(default_factory=dict)
    # the account this instance runs as (``account_label``): the reasons it puts on nodes name it,
    # and only a reason naming it and the run is its own; empty in the simulator
    account: str = ""

    @property
    def now(self) -> float:
        return self.snapshot.taken_at


@dataclass(frozen=True)
class Policy:
    may_change_nodes: bool = True
    drains_left: int = 8  # blast radius left in the current window
    fence: bool = False  # a site fence command is configured
    evidence_wait_s: float = 0.0  # after an unexplained job death, wait this long for node agents' evidence
    stuck_page_s: float = 1800.0  # a run that cannot be placed pages after waiting this long
    when_short: str = "use-least-bad"  # [quarantine] when_short: quarantined nodes for a run short of nodes
    storm: bool = False  # the blast radius is spent: more nodes faulted within the hour than it allows
    kill_wait_s: float = 30.0  # Slurm's KillWait: SIGTERM to SIGKILL of a job's processes on a node


def account_label(name: str, uid: int) -> str:
    """How a node reason names an account: its name, or ``#UID`` when the name has another shape
    (no account name can be ``#…``, so no two accounts share a label). The guard and the daemon
    both name an account so, the guard from the kernel's UID of its caller."""
    return name if _ACCOUNT.match(name) else f"#{uid}"


def node_reason(account: str, run: str, why: str) -> str:
    """The reason on a node the supervisor changes: ``slurm-supervisor: run ACCOUNT/RUN: WHY``
    (without an account, as in the simulator: ``run RUN``)."""
    return f"{REASON_PREFIX}: run {_mark(account, run)}: {why}"[:200]


def marked_by_us(reason: str, account: str, run: str) -> bool:
    """Did this account's run change the node? A run name alone is anyone's to give."""
    return reason.startswith(f"{REASON_PREFIX}: run {_mark(account, run)}:")


def reason_cause(reason: str) -> str:
    """A supervisor reason without its ``slurm-supervisor: run ACCOUNT/RUN: `` prefix."""
    head = f"{REASON_PREFIX}: run "
    if not reason.startswith(head):
        return reason
    _, sep, cause = reason[len(head) :].partition(": ")
    return cause if sep else reason


def _mark(account: str, run: str) -> str:
    return f"{account}/{run}" if account else run


def set_terminal(run: RunRecord, state: RunState, kind: EventKind, why: str, obs: Observation) -> Decision:
    return Decision((SetState(run.name, state, reason=why), event_for(run, run.attempt, kind, why, obs)))


def event_for(
    run: RunRecord,
    a: AttemptRecord | None,
    kind: EventKind,
    message: str,
    obs: Observation,
    evidence: Mapping[str, Any] | None = None,
    suffix: str = "",
) -> Event:
    seq = a.seq if a else None
    key = f"{run.name}:{seq}:{kind.value}:{suffix}"
    return Event(
        run.name, kind, message, key, obs.now, seq, a.job_id if a else None, "supervisor", dict(evidence or {})
    )


FEW_NODES = 8  # named one by one, in their order; more are a hostlist and a count


def fmt_nodes(nodes: tuple[str, ...]) -> str:
    """Nodes for a logbook line: a few by name, more as a Slurm hostlist (a 2,048-node step
    named node by node made a 16 KB line of every swap)."""
    if len(nodes) <= FEW_NODES:
        return ",".join(nodes) or "(no nodes)"
    return _hostlist(tuple(nodes))


@lru_cache(maxsize=64)
def _hostlist(nodes: tuple[str, ...]) -> str:
    """Folding thousands of names takes milliseconds, and a job's nodes are named in several
    lines (started, ended, swapped): folded once."""
    return f"{fold(nodes)} ({len(nodes)} nodes)"
