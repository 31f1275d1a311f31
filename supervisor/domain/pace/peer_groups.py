"""Like with like: which nodes a straggler scorer compares with which, and what it learns at start.

A straggler is a node slower than its *peers doing the same work*. In a pipeline-parallel job the
last stage (loss, output layer) or the first (embedding) is slower by design; with uneven work
like that, comparing every node with every other names whole stages. Two remedies, both here:

* **Peer groups** (:class:`PeerGroups`): a trainer says each rank's peer group (its pipeline stage,
  or any role id; ``telemetry.jsonl.megatron_peer_groups`` derives it from Megatron's layout) and a
  node is compared only with the nodes of its group: each step's reference is its group's median.
  Groups of fewer than ``min_peers`` nodes have no median worth the name: they are pooled with the
  others and each of their nodes is compared with its *own* start-up pace instead.
* **Start-up levels** (:func:`learn_levels`): without group information, the scorer keeps each
  node's raw step times of its first ``learn_steps`` steps. A set of nodes side by side (a block:
  stages are contiguous rank ranges in Megatron's and torchtitan's layouts, so contiguous node
  ranges) that is consistently slower *together* from the start is uneven work, not a straggler:
  its level is learned (the median of its nodes' relative times) and from then on each of its nodes
  is compared with that level. It is reported as an imbalance, never named. A node slower on its own
  from the start is not a block: it is still named. "Consistently" is a test: a node's level must
  exceed its peers' by ``min_slowdown`` *and* by ``LEVEL_Z`` standard errors of its own median
  (from its own step-to-step spread), so noisy ranks (uneven sequence lengths) form no block by
  chance. Blocks split where neighbours' levels jump by ``2 * min_slowdown`` (two stages of
  different cost side by side; a lone slow node inside a block stays alone, so it is named).
  The search repeats with the learned levels applied (a third of nodes slow by 1.6x moves the median,
  hiding a second stage slow by 1.3x until the first is levelled), at most ``MAX_ROUNDS`` times.

Costs: :meth:`PeerGroups.medians` is one sort of a float key (group id + value scaled into [0, 1))
per step, O(n log n) but a single numpy call (~0.3 ms at 16,384 nodes); learning runs once per
attempt. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

MAD_TO_SIGMA = 1.4826
MEDIAN_SE = 1.2533  # standard error of a median, in standard deviations / sqrt(n), for normal data
LEVEL_Z = 5.0  # a learned level is a level, not noise, when this many standard errors above
MAX_ROUNDS = 4


class PeerGroups:
    """Peer group ids per node, and the per-step median of each node's group."""

    def __init__(self, ids: npt.ArrayLike | None, nodes: int, min_peers: int = 3) -> None:
        self.nodes = nodes
        raw = np.zeros(nodes, dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
        if raw.shape != (nodes,):
            raise ValueError(f"expected {nodes} peer group ids, got shape {raw.shape}")
        labels, inverse, sizes = np.unique(raw, return_inverse=True, return_counts=True)
        self.pooled: BoolArray = sizes[inverse] < min_peers  # too few peers: own past instead
        self.label_of = raw  # the trainer's group id of each node
        self.ids: IntArray = inverse.astype(np.int64)
        if self.pooled.any():
            big = np.flatnonzero(sizes >= min_peers)
            target = int(big[np.argmax(sizes[big])]) if self.pooled.sum() < min_peers and big.size else -1
            self.ids[self.pooled] = target if target >= 0 else labels.size
        self.count = int(np.unique(self.ids).size)
        self.sizes: IntArray = np.bincount(self.ids).astype(np.int64)
        self.given = ids is not None
        self._gid = self.ids.astype(np.float64)
        self._order = np.argsort(self.ids, kind="stable")
        self._starts = np.concatenate(([0], np.cumsum(self.sizes)[:-1])).astype(np.int64)
        self._min_peers = min_peers

    def medians(self, values: FloatArray, valid: BoolArray) -> FloatArray | float:
        """Each node's group median of ``values`` over ``valid`` nodes (one float for one group);
        NaN where the group has fewer than ``min_peers`` valid nodes."""
        if self.count == 1:
            n_valid = int(np.count_nonzero(valid))
            if n_valid < self._min_peers:
                return np.nan
            return float(np.median(values if n_valid == valid.size else values[valid]))
        top = float(np.max(values, where=valid, initial=0.0))
        scale = 1.0 / (top * 1.0001) if top > 0 else 1.0
        # group id + value scaled into [0, 1): one sort puts groups in order, each sorted inside;
        # invalid values sort last in their group (0.99995 > any scaled valid value)
        key = self._gid + np.where(valid, values * scale, 0.99995)
        ordered = np.sort(key)
        counts = np.bincount(self.ids, weights=valid, minlength=self.sizes.size).astype(np.int64)
        lo = self._starts + np.maximum(counts - 1, 0) // 2
        hi = self._starts + counts // 2
        gid = np.arange(self.sizes.size, dtype=np.float64)
        med = 0.5 * ((ordered[lo] - gid) + (ordered[hi] - gid)) / scale
        med[counts < self._min_peers] = np.nan
        out: FloatArray = med[self.ids]
        return out

    def describe(self, node: int) -> str:
        """Who a node is compared with, for evidence."""
        peers = int(self.sizes[self.ids[node]]) - 1
        if self.pooled[node]:
            return f"its own start-up pace (its peer group has fewer than {self._min_peers} nodes)"
        if not self.given or self.count == 1:
            return f"the median of its {peers} peers (all nodes of the job)"
        return f"the median of its {peers} peers (peer group {int(self.label_of[node])})"


@dataclass(frozen=True)
class Imbalance:
    """Nodes that were slower together from the start: uneven work, reported, never drained."""

    nodes: tuple[int, ...]
    names: tuple[str, ...]
    level: float  # their step time over their peers', e.g. 1.3
    steps: int  # start-up steps the level was learned over
    reason: str


def learn_levels(
    raw: FloatArray, groups: PeerGroups, min_slowdown: float, mad_floor: float, min_block: int = 2
) -> tuple[FloatArray, list[IntArray]]:
    """Per-node reference levels from the start-up steps ``raw`` (steps x nodes, NaN = missing):
    1 for ordinary nodes, the learned level for nodes of a block (and of pooled small groups).
    Also returns the blocks found (node indices, side by side)."""
    own, se = _levels(raw, groups, mad_floor)
    level = np.ones(groups.nodes)
    block_of = np.full(groups.nodes, -1, dtype=np.int64)
    for _ in range(MAX_ROUNDS):
        ordinary = ~groups.pooled & (block_of < 0) & np.isfinite(own)
        filled = np.nan_to_num(own, nan=1.0)
        base = groups.medians(filled, ordinary)
        if not np.all(np.isfinite(base)):  # a group of pooled nodes only: their own median
            base = np.where(np.isfinite(base), base, groups.medians(filled, np.isfinite(own)))
        rel = own / base  # start-up level over the ordinary nodes'
        ok = groups.pooled & np.isfinite(rel)
        level[ok] = rel[ok]
        grew = _grow(block_of, rel, se, ordinary, groups.ids, min_slowdown, min_block)
        for b in np.unique(block_of[block_of >= 0]):
            members = block_of == b
            level[members] = float(np.nanmedian(rel[members]))
        if not grew:
            break
    blocks = [np.flatnonzero(block_of == b) for b in np.unique(block_of[block_of >= 0])]
    return level, blocks


def _grow(
    block_of: IntArray,
    rel: FloatArray,
    se: FloatArray,
    ordinary: BoolArray,
    ids: IntArray,
    min_slowdown: float,
    min_block: int,
) -> bool:
    """Side-by-side runs (same group) of nodes consistently slower than their peers, together with
    blocks already found, split where neighbours' levels jump (two stages of different cost; a lone
    slow node inside a block). Runs with a new node become blocks (``block_of`` updated); whether
    any node joined."""
    excess = rel - 1.0
    with np.errstate(invalid="ignore"):
        slow = ordinary & (excess >= min_slowdown) & (excess >= LEVEL_Z * se)
    idx = np.flatnonzero(slow | (block_of >= 0))
    if idx.size < min_block:
        return False
    jump = np.abs(np.diff(rel[idx])) >= 2 * min_slowdown
    cuts = np.flatnonzero((np.diff(idx) != 1) | jump | (np.diff(ids[idx]) != 0)) + 1
    grew = False
    for run in np.split(idx, cuts):
        if run.size >= min_block and slow[run].any():
            block_of[run] = int(run[0])  # a block is named by its first node: merged blocks agree
            grew = True
    return grew


def _levels(raw: FloatArray, groups: PeerGroups, mad_floor: float) -> tuple[FloatArray, FloatArray]:
    """Each node's start-up level and its standard error (from the node's own step-to-step spread),
    by median polish: ``time = common(step, group) x own(node) x noise``. The common factor is the
    group median of ``time / own`` (unimodal once levels are out, so stable where a plain median
    would sit between two stages); NaN for a node seen in fewer than half the steps."""
    x = np.where(np.isfinite(raw) & (raw > 0), raw, np.nan)
    with np.errstate(all="ignore"):
        own = _nanmedian(x)
        for _ in range(2):
            common = np.empty_like(x)
            for t, row in enumerate(x / own):
                common[t] = groups.medians(row, np.isfinite(row))
            own = _nanmedian(x / common)
        seen = np.isfinite(x / common).sum(axis=0)
        own[seen * 2 < x.shape[0]] = np.nan
        spread = _nanmedian(np.abs(x / (common * own) - 1.0))
        se = MEDIAN_SE * MAD_TO_SIGMA * np.maximum(np.nan_to_num(spread), mad_floor) / np.sqrt(np.maximum(seen, 1))
    return own, se


def _nanmedian(x: FloatArray) -> FloatArray:
    if not np.isnan(x).any():
        out: FloatArray = np.median(x, axis=0)
        return out
    all_nan = np.isnan(x).all(axis=0)
    filled = np.where(all_nan, 0.0, x)
    med: FloatArray = np.nanmedian(filled, axis=0)
    med[all_nan] = np.nan
    return med


def span(names: Sequence[str]) -> str:
    """A short list of node names for a logbook line."""
    if len(names) <= 4:
        return ", ".join(names)
    return f"{names[0]} .. {names[-1]}"
