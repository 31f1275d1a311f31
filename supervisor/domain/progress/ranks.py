"""Who hangs: each rank's last progress, and the ranks (and nodes) a hang's evidence singles out.

"Which rank hangs?" is the question a hang leaves. When each rank reports for itself (JSONL lines
with ``rank``, or a launcher's rank prefix), :class:`RankProgress` keeps every rank's newest step and
when it was read. At a hang, :func:`suspects` compares them: ranks whose last step is behind the
newest step every other rank reached are suspects, and their nodes are *singled out* only when they
are few — at most ``max(1, nodes // 8)`` nodes and fewer than half of the reporting ranks — and all
the other ranks agree on the newest step. Otherwise the evidence says "no single rank" and no node
is blamed: a job-wide stall (storage, the network, a deadlock in the program) must not cost a node.

Node agents' GPU activity is a second witness (:func:`idle_suspects`): GPUs of a stopped rank go
idle while its peers spin in a collective at full utilisation.

Pure: times are passed in; memory is bounded (``MAX_RANKS`` ranks tracked).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MAX_RANKS = 65536
MAX_LISTED = 16  # ranks listed by name in the evidence


@dataclass
class RankProgress:
    """Each reporting rank's newest step and when it was read, for one attempt."""

    steps: dict[int, int] = field(default_factory=dict)
    read_at: dict[int, float] = field(default_factory=dict)

    def observe(self, rank: int, step: int, at: float) -> None:
        if rank < 0 or (rank not in self.steps and len(self.steps) >= MAX_RANKS):
            return
        if step < self.steps.get(rank, -1):
            self.reset()  # the rank's step went back: the trainer restarted from a checkpoint
        if step >= self.steps.get(rank, -1):
            if step > self.steps.get(rank, -1):
                self.read_at[rank] = at
            self.steps[rank] = step

    def reset(self) -> None:
        """The trainer restarted within the job (its step went back): positions start again."""
        self.steps.clear()
        self.read_at.clear()


@dataclass(frozen=True)
class Suspects:
    """What the per-rank evidence says of a hang."""

    singled_out: bool
    ranks: tuple[int, ...]  # ranks behind the others (all of them, singled out or not)
    nodes: tuple[str, ...]  # their nodes, when singled out and the layout is known
    summary: str  # one sentence for the logbook


def suspects(progress: RankProgress, nodes: Sequence[str]) -> Suspects | None:
    """The ranks a hang's evidence points at; ``None`` when fewer than two ranks report."""
    if len(progress.steps) < 2:
        return None
    newest = max(progress.steps.values())
    behind = tuple(sorted(r for r, s in progress.steps.items() if s < newest))
    if not behind:
        return Suspects(
            False, (), (), f"no single rank: all {len(progress.steps)} reporting ranks stopped at step {newest}"
        )
    where = _node_of(progress, nodes)
    suspect_nodes = tuple(sorted({where[r] for r in behind if r in where}))
    few_nodes = max(1, len(nodes) // 8)
    singled = (
        len(behind) * 2 < len(progress.steps)
        and len(where) == len(progress.steps)
        and 0 < len(suspect_nodes) <= few_nodes
    )
    listed = ", ".join(
        f"rank {r} at step {progress.steps[r]}" + (f" ({where[r]})" if r in where else "") for r in behind[:MAX_LISTED]
    )
    more = f" and {len(behind) - MAX_LISTED} more" if len(behind) > MAX_LISTED else ""
    others = len(progress.steps) - len(behind)
    if singled:
        summary = f"suspect {', '.join(suspect_nodes)}: {listed}{more} stopped behind the other {others} ranks, which reached step {newest}"
        return Suspects(True, behind, suspect_nodes, summary)
    summary = f"no single rank: {len(behind)} of {len(progress.steps)} ranks are behind step {newest} ({listed}{more})"
    return Suspects(False, behind, (), summary)


def _node_of(progress: RankProgress, nodes: Sequence[str]) -> dict[int, str]:
    """Each reporting rank's node, when the ranks split evenly over the nodes in blocks (srun's
    default distribution); empty when they do not (the node of a rank is then unknown)."""
    world = max(progress.steps) + 1
    if not nodes or world % len(nodes) or len(progress.steps) != world:
        return {}
    per_node = world // len(nodes)
    return {r: nodes[r // per_node] for r in progress.steps}


def idle_suspects(busy: Mapping[str, float], idle_pct: float = 5.0, spinning_pct: float = 50.0) -> tuple[str, ...]:
    """Nodes whose GPUs went idle (mean utilisation at most ``idle_pct``) while the job's other
    nodes stay busy (median at least ``spinning_pct``: waiting in a collective spins the GPU), when
    they are few (at most ``max(1, nodes // 8)``); empty otherwise."""
    if len(busy) < 2:
        return ()
    values = sorted(busy.values())
    idle = tuple(sorted(n for n, v in busy.items() if v <= idle_pct))
    others = [v for n, v in busy.items() if n not in idle]
    if not idle or not others or len(idle) > max(1, len(busy) // 8):
        return ()
    median = sorted(others)[len(others) // 2]
    return idle if median >= spinning_pct and values[-1] > idle_pct else ()
