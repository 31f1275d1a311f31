"""The terminal logbook as on-call reads it: routine events folded, incidents first-class, `--all`
for every line; the README demo's logbook fits one screen."""

import os
from pathlib import Path

from click.testing import CliRunner

from supervisor.adapters.sqlite import SqliteStore
from supervisor.cli import main
from supervisor.cli.views.logbook_view import folded_lines
from supervisor.domain.records import Event, EventKind
from supervisor.report.fold import Fold, IncidentStart, Line, fold
from supervisor.testing.kit.specs import spec

GOLDEN = Path(__file__).parent.parent / "data" / "golden" / "logbook_fold_demo.txt"
T0 = 1795910400.0  # 2026-11-29 00:00:00 UTC
RUN = "llama-70b"


def _ev(kind: EventKind, message: str, at: float, attempt: int | None = 0, **evidence: object) -> Event:
    key = f"{RUN}:{attempt}:{kind.value}:{at}:{message}"
    return Event(RUN, kind, message, key, T0 + at, attempt, 500 + (attempt or 0), "supervisor", dict(evidence))


def _day() -> list[Event]:
    """36 verified checkpoints, a node fault and its recovery, then 11 more verified."""
    events = [_ev(EventKind.STARTED, "attempt 0 running on n1,n2", 0)]
    events += [
        _ev(EventKind.CHECKPOINT_VERIFIED, f"checkpoint step {s} verified", 60.0 * i, step=s)
        for i, s in enumerate(range(1840, 4641, 80), start=1)
    ]
    events += [
        _ev(EventKind.FAULT, "fault on n2: XID 79", 3000, node="n2"),
        _ev(EventKind.NODE_DRAINED, "n2 downed and drained", 3000),
        _ev(EventKind.STOPPED, "stopped job 500", 3000),
        _ev(EventKind.RESTARTED, "restarted as job 501", 3001, attempt=1),
        _ev(EventKind.STARTED, "attempt 1 running on n1,n3", 3131, attempt=1),
    ]
    events += [
        _ev(EventKind.CHECKPOINT_VERIFIED, f"checkpoint step {s} verified", 3200.0 + 60 * i, attempt=1, step=s)
        for i, s in enumerate(range(4720, 5521, 80))
    ]
    return events


def test_consecutive_verifications_fold_into_one_line_and_incidents_stand_out():
    entries = fold(_day())
    kinds = [type(x) for x in entries]
    assert kinds == [Line, Fold, IncidentStart, Line, Line, Line, Line, Line, Fold]
    assert entries[1].summary() == "36 checkpoint verifications passed, steps 1840–4640"
    head = entries[2]
    assert head.title == "restart after node fault on n2" and head.outcome == "attempt 1 running 2 min 11 s later"
    assert all(x.incident == 1 for x in entries[3:8])
    lines = folded_lines(_day())
    assert len(lines) == 13 and lines[-1] == "(45 routine events folded; --all shows every line)"
    assert lines[3].startswith("INCIDENT 1  2026-11-29 00:50:00 UTC, attempt 0: restart after node fault on n2")
    assert lines[4].startswith("  2026-11-29 00:50:00 UTC  llama-70b  attempt 0  fault ")  # under its head
    assert "until 2026-11-29 00:36:00 UTC" in lines[1]


def test_a_lone_routine_event_is_not_folded_and_an_open_incident_says_so():
    entries = fold(
        [_ev(EventKind.CHECKPOINT_VERIFIED, "step 80 verified", 0, step=80), _ev(EventKind.FAULT, "hang", 9)]
    )
    assert isinstance(entries[0], Line) and isinstance(entries[1], IncidentStart)
    assert entries[1].outcome == "no new attempt running yet"
    assert not any(line.startswith("(") for line in folded_lines([entries[0].event]))


def test_cli_folds_by_default_and_all_prints_every_line(tmp_path):
    store = SqliteStore(tmp_path)
    store.add_run(spec(name=RUN, script="/t.sbatch", partition="gpu"), T0)
    for e in _day():
        store.record_event(e)
    store.close()
    env = {"SLURM_SUPERVISOR_STATE_DIR": str(tmp_path)}

    def logbook(*args: str) -> list[str]:
        result = CliRunner().invoke(main, ["logbook", RUN, *args], env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return [line for line in result.stdout.splitlines() if line]

    folded, every = logbook(), logbook("--all")
    assert len(every) == len(_day()) == 53 and len(folded) == 10
    assert sum("checkpoint verifications passed" in line for line in folded) == 2
    assert sum(" fault " in line for line in logbook("--kind", "fault")) == 1


def _demo_logbook(tmp_path: Path) -> list[str]:
    """The folded logbook of the README demo (`scripts/demo`: `simulate --demo`)."""
    args = ["simulate", "--demo", "--state-dir", str(tmp_path), "--no-progress", "--no-logbook"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    store = SqliteStore(tmp_path)
    try:
        return folded_lines(store.events("llama3-405b"))
    finally:
        store.close()


def test_demo_folded_logbook_matches_golden(tmp_path):
    text = "\n".join(_demo_logbook(tmp_path)) + "\n"
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "folded logbook changed; regenerate with UPDATE_GOLDEN=1 if intended"
    lines = text.splitlines()
    assert len(lines) <= 45 and sum(line.startswith("INCIDENT ") for line in lines) == 4  # one screen
    assert not any(" checkpoint_verified " in line and "checkpoint step" in line for line in lines)
