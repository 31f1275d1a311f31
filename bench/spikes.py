"""Replay of real loss-spike cases: the detector's leave-it / roll-back decision beside the humans'.

A cases folder holds log excerpts (any file but the decisions file and README*) and a decisions
file with the columns of ``human_decisions.csv`` (pipe-separated, ``#`` comment lines). A row is a
case when its ``event_type`` is a loss event (matches ``--event-types``; throughput drops and
hardware failures are not the detector's business), its ``detect_step`` is a number (``~5000``
reads as 5000) and one excerpt's parsed steps span it; the excerpt with the narrowest span wins.
The humans' decision is LEAVE when ``human_action`` starts with "none", else ROLLBACK (a rollback,
a restart from an earlier checkpoint or abandoning the run: any intervention).

The automatic decision comes only from :class:`SpikeDetector` fed the excerpt's records: ROLLBACK
if any outcome asks for one, else LEAVE (a spike still inside its heal window is waited on).
Where it rolls back, the checkpoint is chosen by ``choose_rollback`` among checkpoints assumed
every ``--ckpt-interval`` steps (the decisions file names no checkpoint list) and the check is
that it lies before the onset; the humans' ``rollback_to_step`` is printed beside it.

    .venv/bin/python bench/spikes.py [--cases DIR] [--ckpt-interval 100]

Goal: agreement >= 90%, BLOOM-176B 31216 and BLOOM-13B 29050 left alone. Last line: one JSON
object (``agreement``, ``cases``, ...).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from supervisor.domain.progress import ProgressRecord, parse_text
from supervisor.domain.rollback import choose_rollback, suggest_skip
from supervisor.domain.spike_detector import SpikeDetector
from supervisor.domain.spikes import (
    Decision,
    SpikeOutcome,
    SpikeSettings,
    decide,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CASES = REPO.parent / "shared" / "data" / "spike_cases"
DECISIONS = "human_decisions.csv"
LOSS_EVENTS = r"spike|diverg|nan|overflow|loss"


@dataclass(frozen=True)
class Excerpt:
    name: str
    records: list[ProgressRecord]
    first: int
    last: int


def read_decisions(path: Path) -> list[dict[str, str]]:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return [dict(row) for row in csv.DictReader(lines, delimiter="|")]


def read_excerpts(folder: Path, decisions: str) -> list[Excerpt]:
    out = []
    for f in sorted(folder.iterdir()):
        if not f.is_file() or f.name == decisions or f.name.lower().startswith("readme"):
            continue
        records = [r for r in parse_text(f.read_text(errors="replace")) if r.step is not None]
        if records:
            steps = [r.step for r in records if r.step is not None]
            out.append(Excerpt(f.name, records, min(steps), max(steps)))
    return out


def step_of(text: str) -> int | None:
    m = re.fullmatch(r"\s*~?\s*(\d+)\s*", text or "")
    return int(m.group(1)) if m else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    ap.add_argument("--decisions", default=DECISIONS, help="decisions file name inside --cases")
    ap.add_argument("--ckpt-interval", type=int, default=100, help="assumed checkpoint interval (steps)")
    ap.add_argument("--event-types", default=LOSS_EVENTS, help="regex on event_type selecting loss events")
    args = ap.parse_args(argv)

    folder: Path = args.cases
    if not folder.is_absolute():
        folder = (REPO / folder).resolve() if (REPO / folder).exists() else folder.resolve()
    settings = SpikeSettings()
    excerpts = read_excerpts(folder, args.decisions)
    rows = read_decisions(folder / args.decisions)
    wanted = re.compile(args.event_types, re.IGNORECASE)

    results = []
    print(f"cases from {folder} (checkpoints assumed every {args.ckpt_interval} steps)")
    print(f"{'case':<18} {'excerpt':<56} {'human':<9} {'auto':<9} {'agree':<5} detail")
    for row in rows:
        case = row.get("case_id", "?")
        step = step_of(row.get("detect_step", ""))
        if not wanted.search(row.get("event_type", "")):
            print(f"{case:<18} skipped: event type {row.get('event_type')!r} is not a loss event")
            continue
        matches = [e for e in excerpts if step is not None and e.first <= step <= e.last]
        if not matches:
            print(f"{case:<18} skipped: no log excerpt spans detect_step {row.get('detect_step')!r}")
            continue
        ex = min(matches, key=lambda e: e.last - e.first)
        human = Decision.LEAVE if row.get("human_action", "").strip().lower().startswith("none") else Decision.ROLLBACK
        det = SpikeDetector(settings)
        notices = det.feed_all(ex.records)
        auto = decide(notices)
        outcomes = [n for n in notices if isinstance(n, SpikeOutcome)]
        firing = next((o for o in outcomes if o.decision is Decision.ROLLBACK), None)
        detail: dict[str, object] = {}
        if firing is not None:
            onset = firing.event.onset_step
            ckpts = list(range(0, ex.last + 1, args.ckpt_interval))
            ckpt = choose_rollback(onset, ckpts, settings.min_steps_before)
            skip = suggest_skip(ckpt, onset, settings) if ckpt is not None else None
            detail = {
                "rule": firing.rule,
                "onset": onset,
                "decided_at": firing.decided_step,
                "checkpoint": ckpt,
                "human_rollback_to": row.get("rollback_to_step"),
                "ckpt_before_onset": ckpt is not None and ckpt < onset,
                "skip": skip.as_megatron() if skip else None,
            }
            text = (
                f"{firing.rule} onset {onset} decided@{firing.decided_step}; ckpt {ckpt} "
                f"(humans: {row.get('rollback_to_step')}) before onset: {detail['ckpt_before_onset']}; "
                f"skip {detail['skip']}"
            )
        else:
            healed = [o for o in outcomes if o.rule == "healed"]
            pend = det.pending()
            text = (
                "; ".join(
                    [f"healed {o.steps_after_onset} steps after onset {o.event.onset_step}" for o in healed]
                    + [f"{e.kind.value} spike @{e.onset_step} still in heal window at {ex.last}" for e in pend]
                )
                or "no spike"
            )
        agree = auto is human
        print(f"{case:<18} {ex.name:<56} {human.value:<9} {auto.value:<9} {'yes' if agree else 'NO':<5} {text}")
        results.append(
            {"case": case, "excerpt": ex.name, "human": human.value, "auto": auto.value, "agree": agree, **detail}
        )

    n = len(results)
    agreement = sum(r["agree"] for r in results) / n if n else 0.0
    rolled = [r for r in results if r["human"] == "rollback" and r["auto"] == "rollback"]
    summary = {
        "agreement": round(agreement, 4),
        "cases": n,
        "agreed": sum(bool(r["agree"]) for r in results),
        "disagreed": [r["case"] for r in results if not r["agree"]],
        "rollback_ckpt_before_onset": all(bool(r.get("ckpt_before_onset")) for r in rolled),
        "goal": 0.9,
    }
    print(json.dumps(summary))
    return 0 if n and agreement >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
