"""Where a run's next job may go: its ``--exclude`` list, and why it cannot start when it cannot.

Pure, and recomputed every tick from the nodes' current state, so a waiting restart never keeps
out a node it no longer needs to: a node back in service rejoins at once, whoever had taken it
out (this supervisor, Slurm's health check, an admin).

Three facts shape the list (checked on Slurm 22.05):

* Slurm refuses a job (``sbatch``: "Requested node configuration is not available") that its
  partition could never hold once the excluded nodes are taken out — whatever their state. So a
  list that would leave too few nodes drops first what Slurm itself holds out of service (a DOWN
  or drained node takes no job; when it returns, it is back in service and may serve the run).
* A job whose nodes are down or drained waits (``ReqNodeNotAvail``) and starts when they return.
* A quarantined node that Slurm has in service would take the job at once: it stays excluded,
  unless the run cannot be placed without it and the policy says to use the least-bad one.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from supervisor.domain.cluster import ClusterSnapshot, NodeInfo
from supervisor.domain.decide.spares import exclusions_for
from supervisor.domain.health.quarantine import Quarantine
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord


@dataclass(frozen=True)
class Unavailable:
    """A node of the run's partition that cannot serve it now, and why."""

    node: str
    why: str


@dataclass(frozen=True)
class Placement:
    exclude: tuple[str, ...]  # the --exclude list (one Slurm accepts when ``submittable``)
    needs: int  # nodes the run asks for
    usable: int  # nodes of the partition in service and not kept out (quarantine overrides included)
    unavailable: tuple[Unavailable, ...] = ()  # when short: every node that cannot serve, with why
    overridden: tuple[Quarantine, ...] = ()  # quarantined nodes let in because the run is short without them
    submittable: bool = True  # False: even the shortest list leaves the partition too small for Slurm

    @property
    def short(self) -> bool:
        return self.usable < self.needs

    @property
    def waiting_for(self) -> tuple[str, ...]:
        return tuple(u.node for u in self.unavailable)


def place(
    run: RunRecord,
    snapshot: ClusterSnapshot,
    quarantine: Mapping[str, Quarantine],
    when_short: str = "use-least-bad",
    current: Iterable[str] | None = None,
) -> Placement:
    """The placement of the run's next (or pending) job.

    ``run`` is the run as it stands now (nodes that returned to service already dropped from its
    exclusions). ``current``: the pending job's exclude list — which spares it keeps out stays as
    it is, so that an idle count moving on a busy cluster does not rewrite the job every tick.
    """
    spec = run.spec
    members = {n.name: n for n in snapshot.partition_nodes(spec.partition)}
    if not members:  # no node information (or a multi-partition spec): the plain list
        return Placement(exclusions_for(run, snapshot, quarantine), spec.nodes, spec.nodes)
    held = set(run.excluded) | set(run.deferred)
    barred = {n: q for n, q in quarantine.items() if n not in held}
    usable = {n for n, info in members.items() if info.schedulable and n not in held and n not in barred}
    overridden: tuple[Quarantine, ...] = ()
    if len(usable) < spec.nodes and when_short == "use-least-bad":
        overridden = _least_bad(barred, members, spec.nodes - len(usable))
        usable |= {q.node for q in overridden}
    keep_out = set(barred) - {q.node for q in overridden}
    exclude = set(exclusions_for(run, snapshot, keep_out))
    spares = set(spec.spare_nodes)
    if current is not None and len(usable - spares) >= spec.nodes:  # else the job needs a spare it keeps out
        exclude = (exclude - spares) | (set(current) & spares)
    exclude, fits = _fit(exclude, members, spec.nodes, keep_out, set(spec.spare_nodes))
    unavailable = () if len(usable) >= spec.nodes else _unavailable(run, members, usable, barred, when_short)
    return Placement(tuple(sorted(exclude)), spec.nodes, len(usable), unavailable, overridden, fits)


def _least_bad(barred: Mapping[str, Quarantine], members: Mapping[str, NodeInfo], count: int) -> tuple[Quarantine, ...]:
    """Up to ``count`` quarantined nodes of the partition that Slurm has in service, least bad first."""
    candidates = [q for n, q in barred.items() if n in members and members[n].schedulable]
    return tuple(sorted(candidates, key=lambda q: (q.badness, q.node))[:count])


def _fit(
    exclude: set[str], members: Mapping[str, NodeInfo], needs: int, quarantined: set[str], spares: set[str]
) -> tuple[set[str], bool]:
    """The exclude list shortened until the partition can hold the job in Slurm's eyes: first the
    nodes Slurm itself holds out of service, then spares kept in reserve, then quarantined nodes
    that are out of service. False when nodes in service that must stay out make it impossible."""
    out = set(exclude)
    idle_out = [n for n in sorted(out) if n in members and not members[n].schedulable]
    steps = (
        [n for n in idle_out if n not in quarantined],
        [n for n in sorted(out) if n in spares and n not in quarantined],
        [n for n in idle_out if n in quarantined],
    )
    for step in steps:
        for node in step:
            if len(set(members) - out) >= needs:
                return out, True
            out.discard(node)
    return out, len(set(members) - out) >= needs


def _unavailable(
    run: RunRecord,
    members: Mapping[str, NodeInfo],
    usable: set[str],
    barred: Mapping[str, Quarantine],
    when_short: str,
) -> tuple[Unavailable, ...]:
    out = []
    for name in sorted(members):
        if name in usable:
            continue
        info = members[name]
        state = _slurm_state(info)
        if name in run.excluded:
            why = f"kept out of this run ({run.excluded[name]}); {state}"
        elif name in run.deferred:
            why = f"degraded, kept out of this run ({run.deferred[name][1]}); {state}"
        elif name in barred:
            why = f"{barred[name].reason}; {state}; [quarantine] when_short = {when_short}"
        else:
            why = state
        out.append(Unavailable(name, why))
    return tuple(out)


def _slurm_state(info: NodeInfo) -> str:
    if info.schedulable:
        return "in service in Slurm"
    flags = "+".join(sorted(f for f in info.flags if f in ("DRAIN", "DRAINED", "DRAINING", "NOT_RESPONDING")))
    state = info.state.value + (f"+{flags}" if flags else "")
    return f"{state} in Slurm" + (f": {info.reason}" if info.reason else "")


# ---------------------------------------------------------------- what the logbook says of it


@dataclass(frozen=True)
class PlacementNotes:
    """The logbook entries a placement calls for, and when to look again (the page's deadline)."""

    events: tuple[Event, ...] = ()
    recheck_at: float | None = None


def placement_notes(
    run: RunRecord,
    attempt: AttemptRecord | None,
    placement: Placement,
    since: float,
    now: float,
    page_after_s: float,
    *,
    waiting: bool = True,
) -> PlacementNotes:
    """Quarantine overrides (one entry per node and quarantine), and for a run that cannot be
    placed (and ``waiting``: a job about to be submitted reports its wait once it is queued) one
    entry per wait — which nodes it waits for and why, since when — and one page once it has
    waited ``page_after_s``."""
    events = [_override_event(run, attempt, q, placement, now) for q in placement.overridden]
    if not placement.short or not waiting:
        return PlacementNotes(tuple(events))
    message = _waiting_message(placement, since)
    events.append(_note(run, attempt, EventKind.WAITING_FOR_NODES, message, now, placement, since))
    page_at = since + page_after_s
    if now < page_at:
        return PlacementNotes(tuple(events), page_at)
    waited = f"waited {_duration(now - since)} to be placed: {events[-1].message}"
    events.append(_note(run, attempt, EventKind.STUCK, waited, now, placement, since, f"{run.name}:stuck:{since:.0f}"))
    return PlacementNotes(tuple(events))


def _note(
    run: RunRecord,
    attempt: AttemptRecord | None,
    kind: EventKind,
    message: str,
    now: float,
    placement: Placement,
    since: float,
    key: str | None = None,
) -> Event:
    """A logbook entry about the wait: one per wait and set of nodes waited for (the key)."""
    digest = zlib.crc32(",".join(placement.waiting_for).encode())
    evidence = {
        "needs": placement.needs,
        "usable": placement.usable,
        "since": since,
        "waiting_for": {u.node: u.why for u in placement.unavailable[:MAX_LISTED]},
    }
    return Event(
        run=run.name,
        kind=kind,
        message=message,
        key=key or f"{run.name}:waiting:{since:.0f}:{digest:08x}",
        at=now,
        attempt=attempt.seq if attempt else None,
        job_id=attempt.job_id if attempt else None,
        evidence=evidence,
    )


MAX_LISTED = 20  # nodes named in one logbook entry; the count says how many more


def _waiting_message(placement: Placement, since: float) -> str:
    listed = "; ".join(f"{u.node}: {u.why}" for u in placement.unavailable[:MAX_LISTED])
    more = len(placement.unavailable) - MAX_LISTED
    tail = f"; and {more} more" if more > 0 else ""
    job = "its job waits in the queue" if placement.submittable else "no job can be submitted yet"
    return (
        f"cannot be placed: needs {placement.needs} nodes, {placement.usable} usable ({job}) since "
        f"{_utc(since)}; waiting for {listed}{tail}"
    )


def _override_event(run: RunRecord, a: AttemptRecord | None, q: Quarantine, placement: Placement, now: float) -> Event:
    message = (
        f"using quarantined {q.node} for this run: without it the run cannot be placed (needs "
        f"{placement.needs} nodes); least bad of the quarantined nodes in service ({q.reason}); "
        "[quarantine] when_short = use-least-bad"
    )
    evidence = {"node": q.node, "faults": len(q.faults), "quarantined_since": q.since, "until": q.until}
    key = f"{run.name}:override:{q.node}:{q.since:.0f}"
    seq, job = (a.seq, a.job_id) if a else (None, None)
    return Event(run.name, EventKind.QUARANTINE_OVERRIDE, message, key, now, seq, job, evidence=evidence)


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min"
