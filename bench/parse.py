"""Progress-log parsing speed: lines per second on one core, per format.

The headline is a real Megatron log (BigScience's Megatron-DeepSpeed GPT-2 run, 64 ranks:
iteration lines between timer lines, per-rank memory reports and start-up output) repeated in
memory to at least 500,000 lines and fed line by line to the stateful parser that the supervisor
uses on a job's output (``parser_for("megatron").feed``). Other rows: iteration lines only (every
line a record), terminal-wrapped lines, auto-detection, and each other format's sample lines from
the public issues. Goal: >= 200,000 Megatron lines/s.

    .venv/bin/python bench/parse.py [--lines 500000] [--repeats 3]

Prints a table, then as its last line one JSON object (``lines_per_s`` is the headline).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from supervisor.domain.progress import detect_format, parse_trainer_state, parser_for

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"
FIXTURES = REPO / "tests" / "data" / "train_logs"
REAL_LOG = "bigscience_meg_ds_3d_gpt2_perf_n16-ds-off.out"
GOAL = 200_000


@dataclass(frozen=True)
class Case:
    name: str
    format: str | None
    lines: list[str]
    note: str


@dataclass(frozen=True)
class Result:
    case: Case
    lines: int
    records: int
    seconds: list[float]

    @property
    def lines_per_s(self) -> float:
        return self.lines / statistics.median(self.seconds)

    @property
    def records_per_s(self) -> float:
        return self.records / statistics.median(self.seconds)


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")


def real_megatron_log() -> tuple[Path, list[str]]:
    shared = SHARED / "train_logs" / REAL_LOG
    if shared.exists():
        return shared, read_lines(shared)
    excerpt = FIXTURES / "megds_gpt2_3d_n16_L740-900.out"  # the same log, an excerpt
    return excerpt, read_lines(excerpt)


def fixture(name: str, keep: Callable[[str], bool] = lambda line: bool(line.strip())) -> list[str]:
    return [line for line in read_lines(FIXTURES / name) if keep(line)]


def is_iteration(line: str) -> bool:
    return " iteration " in line and "/" in line and line.rstrip().endswith("|")


def cases(real: list[str]) -> list[Case]:
    iteration_only = [
        *fixture("bloom176b_spike_iter31214-31251.log", is_iteration),
        *fixture("bloom13b_spike_iter29020-29090.log", is_iteration),
        *fixture("tr8b_104b_overflow_L445-462.log", is_iteration),
    ]
    return [
        Case("megatron: real log", "megatron", real, "all lines of the log, noise included"),
        Case("megatron: iteration lines only", "megatron", iteration_only, "every line a record"),
        Case(
            "megatron: terminal-wrapped",
            "megatron",
            fixture("bloom176b_throughput_drop_iter42780-42784_wrapped.log"),
            "3 lines per record",
        ),
        Case("auto-detect: real Megatron log", None, real, "every format tried until one matches"),
        Case("nemo (1.x bar, 2 logger)", "nemo", fixture("issues_nemo_L35-47.log"), "issue samples"),
        Case("torchtitan", "torchtitan", fixture("issues_torchtitan_L48-71.log"), "issue samples"),
        Case("hf-trainer console", "hf-trainer", fixture("issues_hf_trainer_L72-77.log"), "issue samples"),
        Case("fairseq / metaseq", "fairseq", fixture("issues_fairseq_L78-83.log"), "issue samples"),
        Case("ssv-jsonl", "ssv-jsonl", jsonl_lines(), "written by supervisor.telemetry.jsonl"),
    ]


def jsonl_lines() -> list[str]:
    from supervisor.telemetry.jsonl import encode

    return [
        encode(step, loss=2.0 + 1 / step, step_time_s=0.5, tokens_per_s=1.2e6, rank_step_times_s=[0.5] * 8)
        for step in range(1, 101)
    ]


def repeat(lines: list[str], at_least: int) -> list[str]:
    times = -(-at_least // max(1, len(lines)))
    return lines * times


def measure(case: Case, total: int, repeats: int) -> Result:
    lines = repeat(case.lines, total)
    seconds, records = [], 0
    for _ in range(repeats):
        parser = parser_for(case.format)
        feed = parser.feed
        start = time.perf_counter()
        found = 0
        for line in lines:
            found += len(feed(line))
        found += len(parser.flush())
        seconds.append(time.perf_counter() - start)
        records = found
    return Result(case, len(lines), records, seconds)


def pin_one_core() -> str:
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned (no sched_setaffinity)"
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=500_000, help="lines per case (at least)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per case; the median is reported")
    args = ap.parse_args(argv)

    pinned = pin_one_core()
    source, real = real_megatron_log()
    print(f"source: {source} ({len(real)} lines, {sum(map(is_iteration, real))} iteration lines)")
    print(f"python {sys.version.split()[0]}, {pinned}, {args.repeats} runs per case, median shown")
    print()
    results = [measure(case, args.lines, args.repeats) for case in cases(real)]
    head = f"{'case':34} {'format':11} {'lines':>9} {'records':>8} {'lines/s':>11} {'records/s':>10}  note"
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r.case.name:34} {r.case.format or 'auto':11} {r.lines:9d} {r.records:8d} "
            f"{r.lines_per_s:11,.0f} {r.records_per_s:10,.0f}  {r.case.note}"
        )

    start = time.perf_counter()
    detected = detect_format(real)
    detect_ms = (time.perf_counter() - start) * 1000
    state = (FIXTURES / "hf_trainer_state_whisper_excerpt.json").read_text(encoding="utf-8")
    start = time.perf_counter()
    state_records = sum(len(parse_trainer_state(state)) for _ in range(200))
    state_per_s = state_records / (time.perf_counter() - start)
    print()
    print(f"detect_format on the real log's {min(len(real), 5000)} first lines: {detected!r} in {detect_ms:.1f} ms")
    print(f"trainer_state.json (HF): {state_per_s:,.0f} log_history records/s")

    headline, iterations = results[0], results[1]
    print()
    print(
        f"Megatron: {headline.lines_per_s:,.0f} lines/s on the real log, "
        f"{iterations.lines_per_s:,.0f} lines/s when every line is an iteration line; "
        f"goal >= {GOAL:,}: {'met' if headline.lines_per_s >= GOAL else 'NOT met'}"
    )
    summary = {
        "lines_per_s": round(headline.lines_per_s),
        "goal_lines_per_s": GOAL,
        "goal_met": headline.lines_per_s >= GOAL,
        "iteration_lines_per_s": round(iterations.lines_per_s),
        "records_per_s": round(headline.records_per_s),
        "lines": headline.lines,
        "source": str(source.relative_to(REPO.parent) if source.is_relative_to(REPO.parent) else source),
        "by_case": {r.case.name: round(r.lines_per_s) for r in results},
        "detect_format_ms": round(detect_ms, 1),
        "pinned": pinned,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
