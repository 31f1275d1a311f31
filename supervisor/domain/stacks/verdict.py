"""Who hangs, from every rank's stack: the ranks *not* in the collective the others wait in.

At a hang the ranks that reached the collective wait there for the ones that did not. When most
ranks wait in a collective and a few are elsewhere (data loading, checkpoint I/O, their own code),
those few are the suspects, and their nodes are *singled out* — kept out of the restart — under
the rule ``domain.progress.ranks`` follows for per-rank steps: on few nodes (at most
``max(1, nodes // 8)``) and no more of them than ranks waiting. Every rank in a collective (a
mismatched collective, a lost peer, the network), no rank in one, a node whose stacks are
missing, or a rank whose stack moved between the agent's two samples (the job still runs: one
snapshot of a healthy job also shows ranks outside a collective): "no single rank", nobody blamed — a job-wide stall must not cost a node, and a node we
could not see is unverified, not guilty.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.domain.stacks.dumps import RankDump
from supervisor.domain.stacks.places import Place, Placement, placement
from supervisor.domain.text_safety import printable

MAX_LISTED = 8  # ranks named in a summary
MAX_STACK = 12  # frames of a group's representative stack in the evidence


@dataclass(frozen=True)
class Group:
    """Ranks that wait in the same place (and the same collective or function)."""

    place: Place
    what: str
    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    stack: tuple[str, ...]  # one member's main-thread frames, innermost first, bounded

    def to_json(self) -> dict[str, Any]:
        return {
            "place": self.place.value,
            "what": self.what,
            "ranks": list(self.ranks[:64]),
            "rank_count": len(self.ranks),
            "nodes": list(self.nodes[:64]),
            "stack": list(self.stack),
        }


@dataclass(frozen=True)
class StackVerdict:
    singled_out: bool
    suspects: tuple[int, ...]  # ranks outside the collective (singled out or not)
    nodes: tuple[str, ...]  # their nodes, when singled out
    summary: str
    groups: tuple[Group, ...]
    ranks: int  # ranks with a stack

    def evidence(self) -> dict[str, Any]:
        """For the hang's logbook entry: bounded (the groups' sizes, one stack per group)."""
        return {
            "singled_out": self.singled_out,
            "summary": self.summary,
            "suspect_ranks": list(self.suspects[:64]),
            "suspect_nodes": list(self.nodes),
            "ranks": self.ranks,
            "groups": [g.to_json() for g in self.groups[:16]],
        }


def judge(dumps: Iterable[RankDump], nodes: Sequence[str], missing: Mapping[str, str]) -> StackVerdict:
    """The verdict on one capture: ``dumps`` of the job's ranks, on ``nodes`` (the job's);
    ``missing``: node -> why it gave no stacks."""
    missing = {printable(n, 64): printable(w, 300) for n, w in list(missing.items())[:1024]}
    placed = {d.rank: (d, placement(d)) for d in sorted(dumps, key=lambda d: d.rank)}
    groups = _groups(placed)
    known = {r: p for r, (_, p) in placed.items() if p.place is not Place.UNKNOWN}
    waiting = [r for r, p in known.items() if p.place is Place.COLLECTIVE]
    outside = tuple(r for r, p in known.items() if p.place is not Place.COLLECTIVE)
    unseen = sorted(set(missing) | {d.node for d, p in placed.values() if p.place is Place.UNKNOWN})
    if not known:
        return StackVerdict(False, (), (), _no_stacks(unseen, missing), groups, 0)
    moved = tuple(r for r in known if placed[r][0].moved)
    if moved:  # a hung job's stacks stand still: this one still runs (a false alarm, or it recovered)
        return StackVerdict(False, (), (), _moving(moved, placed), groups, len(known))
    where = {r: placed[r][0].node for r in outside}
    suspect_nodes = tuple(sorted(set(where.values())))
    singled = bool(outside) and bool(waiting) and not unseen and len(outside) <= len(waiting)
    singled = singled and 0 < len(suspect_nodes) <= max(1, len(nodes) // 8)
    summary = _summary(placed, outside, waiting, suspect_nodes if singled else (), unseen)
    return StackVerdict(singled, outside, suspect_nodes if singled else (), summary, groups, len(known))


def _groups(placed: Mapping[int, tuple[RankDump, Placement]]) -> tuple[Group, ...]:
    members: dict[tuple[Place, str], list[RankDump]] = {}
    for dump, p in placed.values():
        members.setdefault((p.place, p.what), []).append(dump)
    out = []
    for (place, what), dumps in members.items():
        stack = tuple(f.text() for f in dumps[0].main_frames[:MAX_STACK])
        nodes = tuple(sorted({d.node for d in dumps}))
        out.append(Group(place, what, tuple(d.rank for d in dumps), nodes, stack))
    return tuple(sorted(out, key=lambda g: (-len(g.ranks), g.place.value, g.what)))


def _listed(ranks: Sequence[int], placed: Mapping[int, tuple[RankDump, Placement]]) -> str:
    def one(r: int) -> str:
        dump, p = placed[r]
        at = f", {p.frame.file}:{p.frame.line}" if p.frame is not None else ""
        return f"rank {r} ({dump.node}) in {p.place.value} ({p.what}{at})"

    more = f" and {len(ranks) - MAX_LISTED} more" if len(ranks) > MAX_LISTED else ""
    return "; ".join(one(r) for r in ranks[:MAX_LISTED]) + more


def _collectives(waiting: Sequence[int], placed: Mapping[int, tuple[RankDump, Placement]]) -> str:
    counts = Counter(placed[r][1].what for r in waiting)
    return ", ".join(f"{what} ×{n}" for what, n in sorted(counts.items(), key=lambda x: (-x[1], x[0]))[:6])


def _summary(
    placed: Mapping[int, tuple[RankDump, Placement]],
    outside: Sequence[int],
    waiting: Sequence[int],
    singled: Sequence[str],
    unseen: Sequence[str],
) -> str:
    gap = f"; no stacks from {', '.join(unseen[:MAX_LISTED])}" if unseen else ""
    if singled:
        who = "the other rank waits" if len(waiting) == 1 else f"the other {len(waiting)} ranks wait"
        others = f"{who} in {_collectives(waiting, placed)}"
        return f"suspect {', '.join(singled)}: {_listed(outside, placed)}, while {others}"
    if not outside:
        return f"no single rank: all {len(waiting)} ranks wait in collectives ({_collectives(waiting, placed)}){gap}"
    if not waiting:
        return f"no single rank: no rank waits in a collective ({_listed(outside, placed)}){gap}"
    return (
        f"no single rank: {len(outside)} of {len(outside) + len(waiting)} ranks are outside the collective "
        f"({_listed(outside, placed)}){gap}"
    )


def _moving(moved: Sequence[int], placed: Mapping[int, tuple[RankDump, Placement]]) -> str:
    listed = ", ".join(f"{r} ({placed[r][0].node})" for r in moved[:MAX_LISTED])
    more = f" and {len(moved) - MAX_LISTED} more" if len(moved) > MAX_LISTED else ""
    return f"no single rank: the stacks of rank(s) {listed}{more} moved between two samples (the job still runs)"


def _no_stacks(unseen: Sequence[str], missing: Mapping[str, str]) -> str:
    why = "; ".join(f"{n}: {missing[n]}" for n in unseen[:MAX_LISTED] if n in missing)
    return f"no stacks: {why}" if why else "no stacks: no training process found"
