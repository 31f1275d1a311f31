"""Spike decisions, automatic beside the expected ones: real excerpts with the humans' decisions,
plus seeded synthetic traces of every pattern (issues 6 and 20).

Real cases come from a cases folder (default ``tests/data/spike_cases``; ``--cases DIR``):

* ``human_decisions.csv`` rows (pipe-separated, ``#`` comments): a row is a case when its
  ``event_type`` is a loss event (``--event-types``), its ``detect_step`` is a number (``~5000``
  reads 5000) and an excerpt's parsed steps span it (the narrowest wins). LEAVE when
  ``human_action`` starts with "none", else ROLLBACK (any intervention).
* ``cases.csv`` rows (optional): an excerpt named explicitly, with its decision and where that
  decision comes from (healthy controls, a resume spike, a divergence no one acted on). Excerpts
  named there are not span-matched against ``human_decisions.csv``.

Synthetic cases: ``--seeds`` traces of each pattern of ``supervisor.sim.faults.spike_shapes`` (fast and
slow heals, divergence, plateau with aftershocks, grad-norm-only spikes, spikes on resume, healthy),
shape parameters drawn from the seed; their onset is known, so latency is measured from the truth.

Every case runs through :class:`SpikeDetector` twice: with today's rules and with the issue-6
rules only (jumps and a fixed heal window: ``trend_detection`` and ``early_decisions`` off), the
baseline. The decision is ROLLBACK if any outcome asks for one, else LEAVE. Where it rolls back, the
checkpoint is chosen among checkpoints assumed every ``--ckpt-interval`` steps and checked to lie
before the onset (the detector's onset must not be later than the truth by more than the margin).

    .venv/bin/python bench/spikes.py [--cases DIR] [--seeds 8] [--ckpt-interval 100]

Goals: ``agreement`` >= 0.9 over all cases, ``cases`` >= 30, ``median_decision_steps`` (onset to
decision, rollback cases) <= 50, ``healthy_rolled_back`` 0. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from supervisor.domain.progress import ProgressRecord, parse_text, parse_trainer_state
from supervisor.domain.spikes.detector import SpikeDetector
from supervisor.domain.spikes.events import Decision, SpikeOutcome, SpikeSettings, decide
from supervisor.domain.spikes.rollback import choose_rollback
from supervisor.sim.faults.spike_shapes import case_set

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CASES = REPO / "tests" / "data" / "spike_cases"
DECISIONS = "human_decisions.csv"
EXPLICIT = "cases.csv"
LOSS_EVENTS = r"spike|diverg|nan|overflow|loss"
BASELINE = SpikeSettings(trend_detection=False, early_decisions=False)  # the issue-6 rules


@dataclass(frozen=True)
class Case:
    name: str
    source: str  # "real" or the synthetic pattern
    excerpt: str
    expected: Decision
    onset: int | None  # where the trouble begins (None: nothing to find)
    records: list[ProgressRecord]
    healthy: bool  # a control with no event at all
    human_rollback_to: str = ""


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return [dict(row) for row in csv.DictReader(lines, delimiter="|")]


def read_records(path: Path) -> list[ProgressRecord]:
    text = path.read_text(errors="replace")
    records = parse_trainer_state(text) if path.suffix == ".json" else parse_text(text)
    return [r for r in records if r.step is not None]


def step_of(text: str) -> int | None:
    m = re.fullmatch(r"\s*~?\s*(\d+)\s*", text or "")
    return int(m.group(1)) if m else None


def decision_of(action: str) -> Decision:
    return Decision.LEAVE if action.strip().lower().startswith("none") else Decision.ROLLBACK


def real_cases(folder: Path, decisions: str, wanted: re.Pattern[str]) -> list[Case]:
    explicit = read_rows(folder / EXPLICIT)
    named = {row["excerpt"] for row in explicit}
    spans = []
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.name not in named | {decisions, EXPLICIT} and not f.name.lower().startswith("readme"):
            records = read_records(f)
            if records:
                steps = [r.step for r in records if r.step is not None]
                spans.append((f.name, records, min(steps), max(steps)))
    out = []
    for row in read_rows(folder / decisions):
        step = step_of(row.get("detect_step", ""))
        matches = [s for s in spans if step is not None and s[2] <= step <= s[3]]
        if not wanted.search(row.get("event_type", "")) or not matches:
            print(f"{row.get('case_id', '?'):<26} skipped: not a loss event, or no excerpt spans its detect_step")
            continue
        name, records, first, last = min(matches, key=lambda s: s[3] - s[2])
        human = decision_of(row.get("human_action", ""))
        out.append(Case(row["case_id"], "real", name, human, step, records, False, row.get("rollback_to_step", "")))
    for row in explicit:
        records = read_records(folder / row["excerpt"])
        onset = step_of(row.get("detect_step", ""))
        human = decision_of(row["human_action"])
        out.append(Case(row["case_id"], "real", row["excerpt"], human, onset, records, onset is None))
    return out


def synthetic_cases(seeds: int, first_seed: int) -> list[Case]:
    return [
        Case(c.name, c.pattern, "synthetic", c.expected, c.onset_step, list(c.records), c.pattern == "healthy")
        for c in case_set(seeds, first_seed)
    ]


def replay(case: Case, settings: SpikeSettings, ckpt_interval: int) -> dict[str, Any]:
    """One case through a fresh detector: the decision, the rule, the latency, the checkpoint."""
    det = SpikeDetector(settings)
    notices = det.feed_all(case.records)
    auto = decide(notices)
    firing = next((n for n in notices if isinstance(n, SpikeOutcome) and n.decision is Decision.ROLLBACK), None)
    out: dict[str, Any] = {"case": case.name, "source": case.source, "expected": case.expected.value}
    out.update(auto=auto.value, agree=auto is case.expected, healthy=case.healthy)
    if firing is None:
        healed = [n for n in notices if isinstance(n, SpikeOutcome) and n.rule == "healed"]
        pending = det.pending()
        out["detail"] = (
            "; ".join(
                [f"healed {o.steps_after_onset} steps after {o.event.onset_step}" for o in healed]
                + [f"{e.kind.value} @{e.onset_step} waited on" for e in pending]
            )
            or "nothing"
        )
        return out
    onset = firing.event.onset_step
    truth = case.onset if case.onset is not None else onset
    ckpt = choose_rollback(onset, list(range(0, case.records[-1].step + 1, ckpt_interval)), settings.min_steps_before)  # type: ignore[operator]
    out.update(
        rule=firing.rule, onset=onset, decided=firing.decided_step, decision_steps=firing.decided_step - truth,
        checkpoint=ckpt, ckpt_before_onset=ckpt is None or ckpt < truth,  # None: no checkpoint, a human is paged
        detail=f"{firing.rule} onset {onset} decided@{firing.decided_step} ({firing.decided_step - truth} steps "
        f"after {truth}); ckpt {ckpt}" + (f" (humans: {case.human_rollback_to})" if case.human_rollback_to else ""),
    )  # fmt: skip
    return out


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(results)
    both = [r for r in results if r["expected"] == "rollback" and r["auto"] == "rollback"]
    steps = [r["decision_steps"] for r in both]
    return {
        "agreement": round(sum(r["agree"] for r in results) / n, 4) if n else 0.0,
        "median_decision_steps": statistics.median(steps) if steps else None,
        "healthy_rolled_back": sum(r["healthy"] and r["auto"] == "rollback" for r in results),
        "leave_cases_rolled_back": sum(r["expected"] == "leave" and r["auto"] == "rollback" for r in results),
        "rollback_ckpt_before_onset": all(bool(r.get("ckpt_before_onset")) for r in both),
    }


def by_source(results: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, list[bool]] = {}
    for r in results:
        out.setdefault(r["source"], []).append(r["agree"])
    return {k: f"{sum(v)}/{len(v)}" for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    ap.add_argument("--decisions", default=DECISIONS, help="decisions file name inside --cases")
    ap.add_argument("--ckpt-interval", type=int, default=100, help="assumed checkpoint interval (steps)")
    ap.add_argument("--event-types", default=LOSS_EVENTS, help="regex on event_type selecting loss events")
    ap.add_argument("--seeds", type=int, default=8, help="synthetic traces per pattern (0: real cases only)")
    ap.add_argument("--first-seed", type=int, default=0)
    args = ap.parse_args(argv)

    folder: Path = args.cases if args.cases.is_absolute() else (Path.cwd() / args.cases).resolve()
    print(f"cases from {folder} + {args.seeds} synthetic per pattern (checkpoints every {args.ckpt_interval} steps)")
    cases = real_cases(folder, args.decisions, re.compile(args.event_types, re.IGNORECASE))
    cases += synthetic_cases(args.seeds, args.first_seed)
    settings = SpikeSettings()
    started = time.perf_counter()
    results = [replay(c, settings, args.ckpt_interval) for c in cases]
    elapsed = time.perf_counter() - started
    baseline = [replay(c, replace(BASELINE), args.ckpt_interval) for c in cases]
    print(f"{'case':<26} {'source':<20} {'excerpt':<52} {'expected':<9} {'auto':<9} {'ok':<3} detail")
    for c, r in zip(cases, results, strict=True):
        ok = "yes" if r["agree"] else "NO"
        print(f"{c.name:<26} {c.source:<20} {c.excerpt:<52} {r['expected']:<9} {r['auto']:<9} {ok:<3} {r['detail']}")
    now, before = summarise(results), summarise(baseline)
    records = sum(len(c.records) for c in cases)
    real = [r for r in results if r["source"] == "real"]
    summary = {
        "agreement": now["agreement"],
        "cases": len(results),
        "agreed": sum(bool(r["agree"]) for r in results),
        "disagreed": [r["case"] for r in results if not r["agree"]],
        "rollback_ckpt_before_onset": now["rollback_ckpt_before_onset"],
        "goal": 0.9,
        "real_cases": len(real),
        "real_agreement": summarise(real)["agreement"],
        "synthetic_cases": len(results) - len(real),
        "by_source": by_source(results),
        "median_decision_steps": now["median_decision_steps"],
        "decision_steps_goal": 50,
        "healthy_cases": sum(bool(c.healthy) for c in cases),
        "healthy_rolled_back": now["healthy_rolled_back"],
        "leave_cases_rolled_back": now["leave_cases_rolled_back"],
        "baseline_issue6_rules": before,
        "us_per_record": round(elapsed / records * 1e6, 1) if records else None,
    }
    print(json.dumps(summary))
    ok = summary["agreement"] >= 0.9 and summary["healthy_rolled_back"] == 0
    return 0 if results and ok else 1


if __name__ == "__main__":
    sys.exit(main())
