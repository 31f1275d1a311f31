"""Like-with-like straggler figures for ``bench/stragglers.py``: synthetic pipeline-parallel traces
(a stage 1.3-2x slower by design), uneven sequence lengths, a 5 % slow node inside a slower stage,
and the real per-worker mini-batch times of four Alibaba PAI jobs.

Each synthetic run is scored twice: with the stage ids a trainer reports (``rank_peer_groups``)
and without any group information (the scorer must then infer the slower stage as a block from
the start-up steps). A *false drain* is a node named that is not the slow node.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from supervisor.domain.pace.stragglers import StragglerScorer

PAI = Path("/work/shared/data/stragglers/alibaba-pai-minibatch")
PP_SIZES = (2, 4, 8, 16)


@dataclass
class Figures:
    runs: int = 0
    false_drains: int = 0
    found: list[float] = field(default_factory=list)  # steps from onset to naming the slow node (inf: never)
    imbalance_reported: int = 0  # runs without groups whose slower stage was reported as an imbalance


def stage_work(rng: np.random.Generator, nodes: int) -> tuple[np.ndarray, np.ndarray, range]:
    """(work per node, stage id per node, the slower stage's nodes): PP stages of equal size, the
    first or the last 1.3-2x slower (embedding; loss and output layer)."""
    pp = int(rng.choice(PP_SIZES))
    stage = np.repeat(np.arange(pp), nodes // pp)
    slow_stage = 0 if rng.random() < 0.5 else pp - 1
    work = np.ones(nodes)
    work[stage == slow_stage] = rng.uniform(1.3, 2.0)
    members = np.flatnonzero(stage == slow_stage)
    return work, stage, range(int(members[0]), int(members[-1]) + 1)


def score_run(
    scorer: StragglerScorer, step: Callable[[int], np.ndarray], steps: int, slow: int | None, onset: int, f: Figures
) -> None:
    scorer.reset()
    wrong: set[int] = set()
    named_at = float("inf")
    for t in range(steps):
        for v in scorer.update(step(t)):
            if v.node == slow:
                named_at = min(named_at, t - onset + 1)
            else:
                wrong.add(v.node)
    f.runs += 1
    f.false_drains += len(wrong)
    if slow is not None:
        f.found.append(named_at)


def pipeline_figures(trace_cls: type, nodes: int, trials: int, steps: int, onset: int, seed: int) -> dict[str, Figures]:
    """Stage imbalance, uneven sequences, and a 5 % slow node in the slower stage; each with and
    without stage ids."""
    out = {k: Figures() for k in ("stage", "seq", "in_stage", "in_stage_nogroups")}
    plain = StragglerScorer(nodes)
    for trial in range(trials):
        rng = np.random.default_rng([seed, 7, trial])
        work, stage, slow_stage = stage_work(rng, nodes)
        grouped = StragglerScorer(nodes, groups=stage)
        for scorer in (plain, grouped):
            tr = trace_cls(rng, nodes, None, 0.0, work=work)
            score_run(scorer, tr.step, steps, None, onset, out["stage"])
            out["stage"].imbalance_reported += scorer is plain and bool(scorer.imbalances)
            tr = trace_cls(rng, nodes, None, 0.0, seq_cv=float(rng.uniform(0.05, 0.2)))
            score_run(scorer, tr.step, steps, None, onset, out["seq"])
        victim = int(rng.choice(np.asarray(slow_stage)))
        for scorer, key in ((grouped, "in_stage"), (plain, "in_stage_nogroups")):
            tr = trace_cls(rng, nodes, victim, 0.05, work=work)
            score_run(scorer, tr.step, steps, victim, onset, out[key])
    return out


def load_pai(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(iterations, times: iterations x workers, NaN = missing) of one PAI job's CSV."""
    rows = list(csv.DictReader(path.open()))
    its = sorted({int(r["time"]) for r in rows})
    workers = max(int(r["worker"]) for r in rows) + 1
    index = {t: i for i, t in enumerate(its)}
    grid = np.full((len(its), workers), np.nan)
    for r in rows:
        grid[index[int(r["time"])], int(r["worker"])] = float(r["batch_time_norm"])
    return np.asarray(its), grid


def pai_report(directory: Path = PAI) -> list[str]:
    """Per PAI trace: who is named (worker, at which iteration, with the evidence) and which
    imbalance is reported. The workers are 10 peers doing the same work (no stage ids)."""
    lines = []
    for path in sorted(directory.glob("job_*_norm.csv")):
        its, grid = load_pai(path)
        scorer = StragglerScorer(grid.shape[1], [f"worker{w}" for w in range(grid.shape[1])])
        named: dict[str, tuple[int, str]] = {}
        for it, row in zip(its, grid, strict=True):
            for v in scorer.update(row):
                named.setdefault(v.name, (int(it), f"{100 * (v.slowdown - 1):.0f}% vs {v.compared_with}"))
        lines.append(f"{path.name}: {grid.shape[0]} sampled iterations, {grid.shape[1]} workers")
        for imb in scorer.imbalances:
            lines.append(f"  imbalance (not drained): {imb.reason}")
        for name, (it, what) in sorted(named.items(), key=lambda kv: kv[1][0]):
            lines.append(f"  named {name} at iteration {it}: {what}")
        if not named:
            lines.append("  named nobody")
    return lines
