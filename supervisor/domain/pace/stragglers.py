"""Straggler scoring across nodes.

A synchronous job runs at the pace of its slowest node, so one GPU that is a few
percent slow costs the whole run those few percent (BLOOM-176B ran ~6 % slow until a node was found
by bisecting with ``--exclude``). Per step, each node reports its step time (per-rank times are
mapped to nodes with :func:`node_step_times`: a node is as slow as its slowest rank). A node is
compared with its *peers* at the same step — the nodes doing the same work (its pipeline stage,
when the trainer says so; all nodes otherwise; see ``domain/pace/peer_groups.py``) — which cancels
everything they share (the all-reduce, waiting for the slowest, checkpoint saves and data-loader
stalls that hit every node):

* robust z of the relative time ``r = x / level / median_of_peers - 1``:
  ``z = r / (1.4826 * max(MAD(r), mad_floor))``, the MAD pooled over all nodes. Median and MAD
  ignore a few slow nodes; the floor (0.5 % by default) keeps a perfectly quiet cluster from
  turning a tiny deviation into a huge score. ``level`` is 1 except for nodes found slower
  *together* from the start (a block: uneven work such as a stage; they are reported as
  :attr:`StragglerScorer.imbalances`, never named) and nodes with too few peers: those are compared
  with their own start-up pace. Levels are learned over the first ``learn_steps`` (16) steps, during
  which nobody is named;
* each z is clipped to ``[-z_clip, z_clip]`` (default 5) so one pathological step adds a bounded
  amount, then fed to a one-sided per-node **CUSUM**: ``S = min(s_cap, max(0, S + z - k))``;
* a node is named when ``S > h`` **and** its exponentially weighted mean relative excess over the
  median (``alpha`` = 0.1, about the last 10-20 steps) is at least ``min_slowdown`` (2 %).
* the verdict says how much slower the node is as the mean relative excess over the steps since
  its CUSUM last rose from 0 (the CUSUM's own estimate of when the shift began), each step bounded
  at 10x. Not the gate's average: its steps are clipped at ``z_clip`` MADs, which on a quiet
  cluster is ~4 %, so a node 10 % slower would be reported "2 % above" when named.

Why CUSUM: it is the optimal sequential test for a persistent shift in the mean (Lorden;
Moustakides), which is exactly what a slow GPU is, and it costs one add and one clip per node. Why
these numbers: clipped steps add at most ``z_clip - k`` = 3.5, so no fewer than six consecutive
extreme steps can ever flag a node whatever the tails, and a healthy node's CUSUM drifts down by
``k`` per step on average. ``k`` = 1 looked enough for Gaussian noise (in-control run length
~exp(2kh)) but on the bench's model (heavy tails, a static ~0.3 % spread between healthy GPUs,
hiccups) healthy nodes that are persistently ~1 % slow reached a CUSUM of ~25 in 10,000 steps;
with ``k`` = 1.5 the highest seen is ~15 of ``h`` = 20. The ``min_slowdown`` gate, in plain ratio
units, is a second, independent guard: a node always 1 % slow is never named, however quiet the
cluster. Under ~1.3 % per-step jitter a 5 % slower node has z ~ 5 and is named in ~7 steps, 3 %
in ~15, 2 % in ~50 (it sits right at the gate). ``s_cap`` (2 h) lets a recovered node clear
quickly. ``bench/stragglers.py`` measures all this on a simulated 2,048-node run.

State is a handful of float arrays of length ``nodes`` (plus ``learn_steps`` rows of start-up
times): O(nodes) memory, and one :meth:`StragglerScorer.update` costs two partitions (median, MAD)
plus a few vector operations, or one sort for several peer groups (~0.7 ms at 16,384 nodes).
Missing reports (NaN, inf, zero or negative times) are ignored: the node's state is left as it was.
Optional health signals (SM clock ratio, throttle flag per node) are tracked the same way and put
into the verdict's evidence; they do not name a node on their own.

A job's throughput against its own baseline (the other signal of a slow node, without per-rank
times) is ``domain/pace/slowdown.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from supervisor.domain.pace.peer_groups import Imbalance, PeerGroups, learn_levels, span

FloatArray = npt.NDArray[np.float64]
MAD_TO_SIGMA = 1.4826
SHIFT_BOUND = 9.0  # a step counts at most 10x its peers' time in the reported slowdown


@dataclass(frozen=True)
class StragglerParams:
    """Thresholds of the straggler scorer (see the module docstring for the reasoning)."""

    min_slowdown: float = 0.02  # slower than the median by at least this ratio
    k: float = 1.5  # CUSUM reference value, in robust-z units
    h: float = 20.0  # CUSUM decision threshold, in robust-z units
    z_clip: float = 5.0  # one step adds at most z_clip - k
    mad_floor: float = 0.005  # MAD floor as a share of the median
    alpha: float = 0.1  # EWMA weight of the relative-excess estimate
    learn_steps: int = 16  # start-up steps whose times set the levels of blocks (nobody named before)
    min_block: int = 2  # side-by-side nodes slower together from the start that make a block

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.k <= 0 or self.h <= 0 or self.z_clip <= self.k:
            raise ValueError("need k > 0, h > 0 and z_clip > k")
        if self.mad_floor <= 0 or self.min_slowdown < 0:
            raise ValueError("need mad_floor > 0 and min_slowdown >= 0")
        if self.learn_steps < 1 or self.min_block < 2:
            raise ValueError("need learn_steps >= 1 and min_block >= 2")


@dataclass(frozen=True)
class StragglerVerdict:
    """A node named as a straggler, with the numbers for the logbook."""

    node: int
    name: str
    slowdown: float  # mean step time / reference since the shift began (CUSUM last at 0), e.g. 1.05
    score: float  # CUSUM statistic, robust-z units
    steps_observed: int  # steps this node reported since the last reset
    sm_clock_ratio: float | None
    throttled_share: float | None
    reason: str
    compared_with: str = ""  # who the node was compared with (peers, or its own start-up pace)


def node_step_times(rank_times: npt.ArrayLike, ranks_per_node: int) -> FloatArray:
    """Per-node step times from per-rank ones (ranks grouped by node): the slowest rank's time.

    Missing ranks (NaN) are ignored; a node with no finite rank is NaN.
    """
    ranks = np.asarray(rank_times, dtype=np.float64)
    if ranks_per_node <= 0 or ranks.size % ranks_per_node:
        raise ValueError(f"{ranks.size} ranks do not split into nodes of {ranks_per_node}")
    grid = np.where(np.isfinite(ranks), ranks, -np.inf).reshape(-1, ranks_per_node)
    worst: FloatArray = grid.max(axis=1)  # numpy's stubs type a reduction as Any
    worst[np.isneginf(worst)] = np.nan
    return worst


def node_peer_groups(rank_groups: npt.ArrayLike, ranks_per_node: int) -> npt.NDArray[np.int64]:
    """Per-node peer group ids from per-rank ones (ranks grouped by node): nodes whose ranks have
    the same groups (in order) are peers. A negative rank id means "not said"."""
    ranks = np.asarray(rank_groups, dtype=np.int64)
    if ranks_per_node <= 0 or ranks.size % ranks_per_node:
        raise ValueError(f"{ranks.size} ranks do not split into nodes of {ranks_per_node}")
    _, inverse = np.unique(ranks.reshape(-1, ranks_per_node), axis=0, return_inverse=True)
    ids: npt.NDArray[np.int64] = inverse.reshape(-1).astype(np.int64)
    return ids


class StragglerScorer:
    """Per-node CUSUM of robust z-scores of step time against like peers; one :meth:`update` per step."""

    def __init__(
        self,
        nodes: int,
        names: Sequence[str] | None = None,
        params: StragglerParams | None = None,
        groups: npt.ArrayLike | None = None,
    ) -> None:
        if nodes <= 0:
            raise ValueError(f"nodes must be positive, got {nodes}")
        if names is not None and len(names) != nodes:
            raise ValueError(f"{len(names)} names for {nodes} nodes")
        self.nodes = nodes
        self.names = tuple(names) if names is not None else tuple(f"node{i}" for i in range(nodes))
        self.params = params or StragglerParams()
        self.groups = PeerGroups(groups, nodes)
        self.cusum = np.zeros(nodes)
        self.excess = np.zeros(nodes)  # EWMA of x / reference - 1
        self.shift_sum = np.zeros(nodes)  # sum of x / reference - 1 since the CUSUM last rose from 0
        self.shift_steps = np.zeros(nodes, dtype=np.int64)
        self.observed = np.zeros(nodes, dtype=np.int64)
        self.clock = np.full(nodes, np.nan)  # EWMA of SM clock ratio
        self.throttle = np.full(nodes, np.nan)  # EWMA of the throttle flag
        self.level = np.ones(nodes)  # a node's start-up level over its peers (1 unless learned)
        self.imbalances: tuple[Imbalance, ...] = ()
        self._startup = np.full((self.params.learn_steps, nodes), np.nan)  # raw times of the first steps
        self.steps = 0

    @property
    def learning(self) -> bool:
        """Still learning start-up levels: nobody is named yet."""
        return self.steps < self.params.learn_steps

    def reset(self) -> None:
        """Forget everything, e.g. after a restart (the node set may have changed too: build anew)."""
        for arr in (self.cusum, self.excess, self.shift_sum):
            arr.fill(0.0)
        self.observed.fill(0)
        self.shift_steps.fill(0)
        self.clock.fill(np.nan)
        self.throttle.fill(np.nan)
        self.level.fill(1.0)
        self._startup.fill(np.nan)
        self.imbalances = ()
        self.steps = 0

    def update(
        self,
        step_times: npt.ArrayLike,
        sm_clock_ratio: npt.ArrayLike | None = None,
        throttled: npt.ArrayLike | None = None,
    ) -> list[StragglerVerdict]:
        """Score one step; returns the nodes named as stragglers now (empty when none)."""
        x = np.asarray(step_times, dtype=np.float64)
        if x.shape != (self.nodes,):
            raise ValueError(f"expected {self.nodes} step times, got shape {x.shape}")
        self._health(sm_clock_ratio, throttled)
        valid = np.isfinite(x) & (x > 0)
        if int(np.count_nonzero(valid)) < 3:
            return self.named()
        if self.learning:
            self._startup[self.steps] = np.where(valid, x, np.nan)
        adj = x / self.level if self.imbalances or self.groups.pooled.any() else x
        with np.errstate(all="ignore"):  # absurd inputs clip to +-z_clip; NaN where a group is too small
            rel = adj / self.groups.medians(adj, valid) - 1.0
            scored = valid & np.isfinite(rel)
            if int(np.count_nonzero(scored)) >= 3:
                self._score(rel, scored)
        self.steps += 1
        if self.steps == self.params.learn_steps:
            self._learn()
        return self.named()

    def _score(self, rel: FloatArray, scored: npt.NDArray[np.bool_]) -> None:
        p = self.params
        all_scored = bool(scored.all())
        r = rel if all_scored else rel[scored]
        scale = MAD_TO_SIGMA * max(float(np.median(np.abs(r))), p.mad_floor)
        z = np.clip(r / scale, -p.z_clip, p.z_clip) - p.k
        shift = np.clip(r, -1.0, SHIFT_BOUND)
        r = np.clip(r, -p.z_clip * scale, p.z_clip * scale)
        if all_scored:
            self.cusum += z
            np.clip(self.cusum, 0.0, 2 * p.h, out=self.cusum)
            self.excess *= 1 - p.alpha
            self.excess += p.alpha * r
            self.observed += 1
            self._track_shift(slice(None), shift)
            return
        self.cusum[scored] = np.clip(self.cusum[scored] + z, 0.0, 2 * p.h)
        self.excess[scored] = (1 - p.alpha) * self.excess[scored] + p.alpha * r
        self.observed[scored] += 1
        self._track_shift(scored, shift)

    def _track_shift(self, where: slice | npt.NDArray[np.bool_], shift: FloatArray) -> None:
        """Sum the relative excess of the steps since each node's CUSUM last rose from 0."""
        rising = self.cusum[where] > 0
        self.shift_sum[where] = np.where(rising, self.shift_sum[where] + shift, 0.0)
        self.shift_steps[where] = np.where(rising, self.shift_steps[where] + 1, 0)

    def _learn(self) -> None:
        """The start-up steps are in: levels of blocks slower together from the start (and of
        nodes without enough peers); their scores start again against those levels."""
        p = self.params
        self.level, blocks = learn_levels(self._startup, self.groups, p.min_slowdown, p.mad_floor, p.min_block)
        learned = self.level != 1.0
        self.cusum[learned] = 0.0
        self.excess[learned] = 0.0
        self.shift_sum[learned] = 0.0
        self.shift_steps[learned] = 0
        self.imbalances = tuple(self._imbalance(b) for b in blocks) + self._pooled_imbalance()

    def _imbalance(self, block: npt.NDArray[np.int64]) -> Imbalance:
        names = tuple(self.names[int(i)] for i in block)
        level = float(np.median(self.level[block]))
        peers = self.groups.describe(int(block[0])).replace("its ", "their ", 1)
        reason = (
            f"{span(names)} ({len(names)} nodes side by side) ran {100 * (level - 1):.1f}% slower than "
            f"{peers} together from the start (median of the first {self.params.learn_steps} steps): uneven "
            "work such as a pipeline stage, not a straggler; not drained; from now on each is compared "
            "with this start-up pace"
        )
        return Imbalance(tuple(int(i) for i in block), names, level, self.params.learn_steps, reason)

    def _pooled_imbalance(self) -> tuple[Imbalance, ...]:
        off = np.flatnonzero(self.groups.pooled & (np.abs(self.level - 1.0) >= self.params.min_slowdown))
        if not off.size:
            return ()
        names = tuple(self.names[int(i)] for i in off)
        levels = ", ".join(f"{self.names[int(i)]} {self.level[i]:.2f}x" for i in off[:8])
        reason = (
            f"{span(names)}: peer groups of fewer than 3 nodes, so each is compared with its own "
            f"start-up pace; over the first {self.params.learn_steps} steps they ran at {levels} of the "
            "other nodes' pace (uneven work, not drained)"
        )
        level = float(np.median(self.level[off]))
        return (Imbalance(tuple(int(i) for i in off), names, level, self.params.learn_steps, reason),)

    def _health(self, clock: npt.ArrayLike | None, throttled: npt.ArrayLike | None) -> None:
        for signal, state in ((clock, self.clock), (throttled, self.throttle)):
            if signal is None:
                continue
            v = np.asarray(signal, dtype=np.float64)
            if v.shape != (self.nodes,):
                raise ValueError(f"expected {self.nodes} health values, got shape {v.shape}")
            ok = np.isfinite(v)
            first = ok & np.isnan(state)
            state[first] = v[first]
            rest = ok & ~first
            state[rest] += self.params.alpha * (v[rest] - state[rest])

    def named(self) -> list[StragglerVerdict]:
        """The nodes named as stragglers in the current state (none while learning)."""
        p = self.params
        if self.learning:
            return []
        hits = np.flatnonzero((self.cusum > p.h) & (self.excess >= p.min_slowdown))
        return [self._verdict(int(i)) for i in hits]

    def _verdict(self, i: int) -> StragglerVerdict:
        since = int(self.shift_steps[i])
        slowdown = 1.0 + (float(self.shift_sum[i]) / since if since else float(self.excess[i]))
        clock = _opt(self.clock[i])
        thr = _opt(self.throttle[i])
        compared = self.groups.describe(i)
        if self.level[i] != 1.0 and not self.groups.pooled[i]:
            compared = f"its own start-up pace ({self.level[i]:.2f}x {compared}, with its block)"
        elif self.groups.pooled[i]:
            compared = f"its own start-up pace ({self.level[i]:.2f}x the other nodes'; too few peers for a median)"
        reason = (
            f"step time {100 * (slowdown - 1):.1f}% above {compared}, "
            f"over the {since} steps since its CUSUM last rose from 0 "
            f"(CUSUM {float(self.cusum[i]):.1f} > {self.params.h:g}, {int(self.observed[i])} reported steps)"
        )
        if clock is not None:
            reason += f"; SM clock at {100 * clock:.0f}% of nominal"
        if thr is not None and thr > 0:
            reason += f"; throttled in {100 * thr:.0f}% of recent samples"
        return StragglerVerdict(
            node=i,
            name=self.names[i],
            slowdown=slowdown,
            score=float(self.cusum[i]),
            steps_observed=int(self.observed[i]),
            sm_clock_ratio=clock,
            throttled_share=thr,
            reason=reason,
            compared_with=compared,
        )


def _opt(value: np.float64) -> float | None:
    return None if np.isnan(value) else float(value)
