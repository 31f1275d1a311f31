"""The Markdown chronicle: OPT-style dated headings per incident, with evidence, decision and cost."""

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.adapters.sqlite import SqliteStore
from supervisor.cli import main
from supervisor.domain.records import AttemptRecord, Event, EventKind, RunRecord
from supervisor.domain.run import RunSpec, RunState
from supervisor.report.chronicle import render_markdown
from supervisor.sim.demo import RUN, DemoSettings, run_demo

GOLDEN = Path(__file__).parent.parent / "data" / "chronicle" / "demo.md"
T0 = 1795910400.0  # 2026-11-29 00:00:00 UTC
HEADING = re.compile(r"^### \d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC \[[\w.-]+\]: Run [\w.-]+( attempt \d+)? — .+$")


def _demo_markdown(state_dir: Path) -> str:
    store = SqliteStore(state_dir)
    try:
        return render_markdown(store.get_run(RUN), store.attempts(RUN), store.events(RUN))
    finally:
        store.close()


def test_demo_chronicle_matches_golden(demo_state_copy, tmp_path):
    text = _demo_markdown(demo_state_copy(tmp_path))
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "chronicle changed; regenerate with UPDATE_GOLDEN=1 if intended"


@pytest.mark.slow  # runs the demo once more (~2 s), for determinism; the session's run is shared
def test_demo_chronicle_content(demo_state_copy, tmp_path):
    text = _demo_markdown(demo_state_copy(tmp_path))
    assert text.startswith("# Logbook of run llama-demo\n")
    headings = [line for line in text.splitlines() if line.startswith("### ")]
    assert len(headings) == 2 and all(HEADING.match(h) for h in headings)
    assert (
        headings[0]
        == "### 2026-11-29 02:38 UTC [supervisor]: Run llama-demo attempt 0 — restart after node fault on n002"
    )
    assert "## Timeline" in text and "submitted as job 1000" in text.split("## Incidents")[0]
    assert "- **Evidence** (n002): observed: slurmd probe failed" in text
    assert "Slurm showed the node ALLOCATED" in text
    assert '  - n002 downed and drained in Slurm, reason "slurm-supervisor: run llama-demo:' in text
    assert "  - stopped job 1000: node fault on n002" in text
    assert "  - restarted as attempt 1 (job 1001), excluding n002, n019, n020" in text
    assert re.search(r"- \*\*Cost\*\*: 0 s from the fault \(2026-11-29 02:38:56 UTC\) to attempt 1 running", text)
    assert "attempt 0 (job 1000) had run 2 h 38 min 56 s" in text
    assert "restarts spent 2 of 10." in text
    assert "UTC" in text and not re.search(r"\b(ET|PT)\b", text)
    again = tmp_path / "again"
    run_demo(DemoSettings(hours=12, crashes=2, seed=7), state_dir=str(again))  # a run of its own
    assert _demo_markdown(again) == text  # deterministic


def _spec(**kw) -> RunSpec:
    return RunSpec(name="llama-70b", script="train.sbatch", partition="gpu", nodes=2, max_restarts=5, **kw)


def test_hand_built_hang_note_and_give_up():
    run = RunRecord(_spec(), RunState.FAILED, restarts_spent=1, end_reason="restart budget spent")
    attempts = [
        AttemptRecord("llama-70b", 0, 500, 0, T0, ("gpu-1", "gpu-2"), (), T0 + 60, T0 + 3600, "CANCELLED", None, None),
        AttemptRecord(
            "llama-70b",
            1,
            501,
            0,
            T0 + 3600,
            ("gpu-1", "gpu-3"),
            (),
            T0 + 3700,
            T0 + 7200,
            "FAILED",
            "NonZeroExitCode",
            1,
        ),
    ]
    hang = {
        "reason": "no training step for 912 s (threshold 900 s)",
        "last_step": 1200,
        "silent_s": 912.0,
        "step_interval_s": 30.0,
        "threshold_s": 900.0,
        "log": "/logs/500.out",
        "records_read": 40,
        "last_lines": ["step 1200 loss 2.31"],
        "nodes": ["gpu-1", "gpu-2"],
    }
    ev = [  # given out of time order on purpose: the chronicle sorts by time
        Event(
            "llama-70b",
            EventKind.NOTE,
            "Looked at gpu-2: NCCL timeout in dmesg.\nLeaving it drained.",
            "n1",
            T0 + 3650,
            0,
            500,
            actor="susan",
        ),
        Event("llama-70b", EventKind.SUBMITTED, "submitted as job 500", "s", T0, 0, 500),
        Event(
            "llama-70b",
            EventKind.STARTED,
            "attempt 0 (job 500, restart 0) running on gpu-1,gpu-2",
            "st0",
            T0 + 60,
            0,
            500,
            evidence={"nodes": ["gpu-1", "gpu-2"]},
        ),
        Event(
            "llama-70b",
            EventKind.FAULT,
            "attempt 0 (job 500, restart 0): hang: no training step for 912 s",
            "llama-70b:0:fault:hang",
            T0 + 3590,
            0,
            500,
            evidence=hang,
        ),
        Event(
            "llama-70b",
            EventKind.STOPPED,
            "attempt 0 (job 500, restart 0) ended CANCELLED after the fault",
            "x",
            T0 + 3600,
            0,
            500,
        ),
        Event(
            "llama-70b",
            EventKind.RESTARTED,
            "attempt 1 (job 501, restart 0): restarted as job 501",
            "r",
            T0 + 3600,
            1,
            501,
            evidence={"exclude": [], "reason": "replacing", "restarts_spent": 1},
        ),
        Event(
            "llama-70b",
            EventKind.STARTED,
            "attempt 1 (job 501, restart 0) running on gpu-1,gpu-3",
            "st1",
            T0 + 3700,
            1,
            501,
        ),
        Event("llama-70b", EventKind.GAVE_UP, "restart budget spent (1 of 1); giving up", "g", T0 + 7300, 1, 501),
    ]
    text = render_markdown(run, attempts, ev)
    heads = [line for line in text.splitlines() if line.startswith("### ")]
    assert heads == [
        "### 2026-11-29 00:59 UTC [supervisor]: Run llama-70b attempt 0 — restart after hang at step 1200",
        "### 2026-11-29 01:00 UTC [susan]: Run llama-70b attempt 0 — note",
        "### 2026-11-29 02:01 UTC [supervisor]: Run llama-70b attempt 1 — gave up",
    ]
    assert all(HEADING.match(h) for h in heads)
    assert (
        "- **Evidence** (hang): no training step for 912 s (threshold 900 s); last step 1200, silent for "
        "15 min 12 s, threshold 15 min, usual step interval 30 s; on gpu-1, gpu-2"
    ) in text
    assert "log `/logs/500.out` (40 records read); last line: `step 1200 loss 2.31`." in text
    assert "> Looked at gpu-2: NCCL timeout in dmesg.\n> Leaving it drained." in text
    assert "— susan, 2026-11-29 01:00:50 UTC" in text
    assert "restarted as attempt 1 (job 501), excluding nothing (replacing)" in text
    assert "- **Cost**: 1 min 50 s from the fault (2026-11-29 00:59:50 UTC) to attempt 1 running" in text
    assert "- **Outcome**: restart budget spent (1 of 1); giving up" in text
    assert (
        "| 1 | 501 | 0 | 2 | 2026-11-29 01:01:40 UTC | 2026-11-29 02:00:00 UTC | 58 min 20 s "
        "| FAILED (NonZeroExitCode), exit 1 |" in text
    )
    assert render_markdown(run, attempts, list(reversed(ev))) == text  # input order does not matter


def test_open_incident_and_empty_log():
    run = RunRecord(_spec(), RunState.RECOVERING)
    fault = Event(
        "llama-70b",
        EventKind.FAULT,
        "attempt 0 (job 9, restart 0): fault on gpu-2: slurmd down",
        "f",
        T0,
        0,
        9,
        evidence={
            "node": "gpu-2",
            "observed": "slurmd down",
            "slurm_state": "DOWN",
            "slurm_flags": ["NOT_RESPONDING"],
            "slurm_reason": "Not responding",
            "probe": "connect refused",
        },
    )
    text = render_markdown(run, [], [fault])
    assert "Run llama-70b attempt 0 — node fault on gpu-2; recovery under way" in text
    assert (
        "observed: slurmd down; probe: connect refused; Slurm showed the node DOWN, flags NOT_RESPONDING, "
        'reason "Not responding".'
    ) in text
    assert "no new attempt running yet" in text
    assert "(no routine events)" in render_markdown(run, [], [])


def test_cli_logbook_formats(demo_state_copy, tmp_path):
    demo_state_copy(tmp_path, hours=6, crashes=1)
    env = {"SLURM_SUPERVISOR_STATE_DIR": str(tmp_path)}

    def logbook(*args: str) -> str:
        result = CliRunner().invoke(main, ["logbook", RUN, *args], env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    md = logbook("--format", "markdown")
    assert md.startswith("# Logbook of run llama-demo") and "### " in md
    assert logbook("--json") == logbook("--format", "json")
    assert logbook() == logbook("--format", "text") and "registered" in logbook()
