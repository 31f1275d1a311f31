"""Stragglers without instrumentation (issue 35, item 3): low-rate py-spy sampling of every rank
gives each rank's share of samples waiting in a collective; a slow rank waits least.

examples/torch/train.py runs as a local gloo world (4 ranks, one a "node", ``--compute-s``: each
step's compute a sleep, as a GPU's share is) with ``rank_step_times_s`` unused; with
``--straggler-file`` one node's compute is 10 % slower. Every rank is sampled at once with
``py-spy record --idle --nonblocking --format raw`` (no pause of the trainer), each sample placed
with ``domain.stacks.places``. The named rank is the one waiting least, when its share is below
the others' median by more than ``MARGIN`` and three binomial standard errors; else none.

Prints a table per case (straggler or none, rate, duration) and, as its last line, one JSON object:
per case whether the slow rank was named (``named``, ``right``), the shares, the gap, py-spy's CPU
per sampled rank (the cost per node: one rank a node here) and the trainer's step-time change
while sampled (``slowdown``, a ratio against the same run's unsampled steps).

    python bench/stack_stragglers.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from supervisor.domain.stacks.dumps import Frame, RankDump, Thread
from supervisor.domain.stacks.places import Place, placement
from supervisor.testing.torch.torch_world import LocalWorld

RANKS = 4
SLOW = "n3"  # the node made slow (rank 2)
MARGIN = 0.03  # the least-waiting rank's share below the others' median by at least this much
PY_SPY = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def place_of(folded: str) -> Place:
    """A raw (folded) sample, outermost frame first: ``fn (file:line);fn (file:line)``."""
    frames = []
    for part in reversed(folded.split(";")):
        name, _, where = part.rpartition(" (")
        file, _, line = where.rstrip(")").rpartition(":")
        frames.append(Frame(name, file, int(line) if line.isdigit() else 0))
    return placement(RankDump("n", 0, 1, (Thread("main", True, tuple(frames)),))).place


def shares(raw: str) -> tuple[float, int]:
    """The share of samples waiting in a collective, and the number of samples."""
    counts: Counter[Place] = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if n.isdigit():
            counts[place_of(stack)] += int(n)
    total = sum(counts.values())
    return (counts[Place.COLLECTIVE] / total if total else 0.0), total


def sample(pids: list[int], rate: int, duration: float, out: Path) -> tuple[list[tuple[float, int]], float]:
    """Every rank sampled at once: (share, samples) per rank, and py-spy's CPU seconds per rank."""
    procs = []
    for i, pid in enumerate(pids):
        argv = [PY_SPY, "record", "--idle", "--nonblocking", "--format", "raw", "--rate", str(rate)]
        argv += ["--duration", str(int(duration)), "--pid", str(pid), "-o", str(out / f"r{i}.txt")]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    cpu = 0.0
    for p in procs:
        _, _, usage = os.wait4(p.pid, 0)
        p.returncode = 0
        cpu += usage.ru_utime + usage.ru_stime
    found = [shares((out / f"r{i}.txt").read_text()) if (out / f"r{i}.txt").exists() else (0.0, 0) for i in range(len(pids))]  # fmt: skip
    return found, cpu / len(pids)


def named(found: list[tuple[float, int]]) -> tuple[int | None, float]:
    """The rank waiting least when it stands out (else None), and its gap to the others' median."""
    least = min(range(len(found)), key=lambda r: found[r][0])
    others = statistics.median(s for r, (s, _) in enumerate(found) if r != least)
    share, n = found[least]
    error = math.sqrt(max(others * (1 - others), 1e-6) / max(n, 1))
    gap = others - share
    return (least if gap > MARGIN and gap > 3 * error else None), gap


def step_times(trace: Path, since: float, until: float) -> float:
    times = [json.loads(x)["time"] for x in trace.read_text().splitlines() if x.strip()]
    inside = [t for t in times if since <= t <= until]
    return (
        statistics.median(b - a for a, b in zip(inside, inside[1:], strict=False)) if len(inside) > 2 else float("nan")
    )


def case(work: Path, slow: bool, plans: list[tuple[int, float]]) -> list[dict[str, Any]]:
    work.mkdir()
    straggler = work / "straggler"
    if slow:
        straggler.write_text(f"{SLOW} 0.1")
    args = ["--steps", "100000", "--ckpt-every", "100000", "--compute-s", "0.1", "--root", str(work / "ckpt")]
    world = LocalWorld(work, "w", [*args, "--straggler-file", str(straggler)], ranks=RANKS).start()
    rows = []
    try:
        while not world.trace.exists() or len(world.trace.read_text().splitlines()) < 20:
            time.sleep(0.5)
        pids = [p.pid for p in world.procs]
        for rate, duration in plans:
            before = time.time()
            time.sleep(duration / 2)
            began = time.time()
            found, cpu = sample(pids, rate, duration, work)
            ended = time.time()
            base, sampled = step_times(world.trace, before, began), step_times(world.trace, began, ended)
            who, gap = named(found)
            rows.append(
                {
                    "straggler": SLOW if slow else None, "rate_hz": rate, "duration_s": duration,
                    "shares": [round(s, 3) for s, _ in found], "samples": [n for _, n in found],
                    "named": world.node(who) if who is not None else None, "gap": round(gap, 3),
                    "right": (who is not None and world.node(who) == SLOW) if slow else who is None,
                    "py_spy_cpu_per_rank": round(cpu / duration, 4), "slowdown": round(sampled / base, 3),
                }
            )  # fmt: skip
    finally:
        for p in world.procs:
            p.kill()
        world.wait(30)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one duration only")
    args = p.parse_args()
    if PY_SPY is None:
        sys.exit("py-spy is needed: pip install -e '.[stacks]'")
    plans = [(20, 10.0)] if args.quick else [(10, 5.0), (10, 15.0), (50, 5.0), (50, 15.0)]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += case(Path(tmp) / "slow", True, plans)
        rows += case(Path(tmp) / "even", False, plans)
    print(f"{'straggler':>9} {'Hz':>4} {'s':>4} {'collective share per rank':>28} {'named':>6} {'gap':>6} {'right':>5} {'cpu/rank':>8} {'slowdown':>8}")  # fmt: skip
    for r in rows:
        share = " ".join(f"{s:.2f}" for s in r["shares"])
        print(f"{r['straggler'] or '-':>9} {r['rate_hz']:>4} {r['duration_s']:>4.0f} {share:>28} {r['named'] or '-':>6} {r['gap']:>6.3f} {str(r['right']):>5} {r['py_spy_cpu_per_rank']:>8.4f} {r['slowdown']:>8.3f}")  # fmt: skip
    print(json.dumps({"cases": rows, "all_right": all(r["right"] for r in rows)}))


if __name__ == "__main__":
    main()
