"""`status`: every run on a line, one run on one screen (state and since when, ETTR, last incident,
next expected checkpoint, what pages); numbers as people write them, "unlimited" included."""

from click.testing import CliRunner

from supervisor.adapters.logbook_html.page import render_html
from supervisor.adapters.sqlite import SqliteStore
from supervisor.cli import main
from supervisor.cli.views import render as cli_render
from supervisor.domain.records import Event, EventKind, RunRecord
from supervisor.domain.run import CheckpointPolicy, RunSpec, RunState
from supervisor.report.chronicle import render_markdown
from supervisor.report.figures import duration, restarts
from supervisor.report.text import seconds

T0 = 1795910400.0  # 2026-11-29 00:00:00 UTC
RUN = "llama-70b"


def _ev(kind: EventKind, message: str, at: float, attempt: int | None = 0, **evidence: object) -> Event:
    return Event(RUN, kind, message, f"{RUN}:{kind.value}:{at}", T0 + at, attempt, 500, "supervisor", dict(evidence))


def _store(tmp_path, *, max_restarts: int = 10, stale: bool = False) -> dict[str, str]:
    """A run that faulted once, restarted, verified checkpoints every 30 min; a stale-checkpoint
    page open when ``stale``."""
    spec = RunSpec(
        name=RUN,
        script="/t.sbatch",
        partition="gpu",
        nodes=2,
        max_restarts=max_restarts,
        checkpoints=CheckpointPolicy(root="/ckpt", expected_interval_s=1800.0),
    )
    store = SqliteStore(tmp_path)
    store.add_run(spec, T0)
    store.set_state(RUN, RunState.QUEUED, T0)
    a0 = store.add_attempt(RUN, 500, 0, T0)
    store.attempt_started(RUN, a0.seq, ("n1", "n2"), T0 + 60)
    store.set_state(RUN, RunState.RUNNING, T0 + 60)
    store.attempt_ended(RUN, a0.seq, T0 + 3600, "NODE_FAIL", "NodeDown", None)
    store.set_state(RUN, RunState.RECOVERING, T0 + 3600)
    a1 = store.add_attempt(RUN, 501, 1, T0 + 3601)
    store.attempt_started(RUN, a1.seq, ("n1", "n3"), T0 + 3700)
    store.set_state(RUN, RunState.RUNNING, T0 + 3700, spend_restart=True)
    events = [
        _ev(EventKind.STARTED, "attempt 0 running", 60),
        _ev(EventKind.CHECKPOINT_VERIFIED, "step 100 verified", 1800, step=100),
        _ev(EventKind.FAULT, "fault on n2: XID 79", 3600, node="n2"),
        _ev(EventKind.RESTARTED, "restarted as job 501", 3601, attempt=1),
        _ev(EventKind.STARTED, "attempt 1 running", 3700, attempt=1),
        _ev(EventKind.CHECKPOINT_VERIFIED, "step 200 verified", 5400, attempt=1, step=200),
    ]
    if stale:
        events.append(_ev(EventKind.CHECKPOINT_STALE, "no verified checkpoint for 2 h", 12600, attempt=1))
    for e in events:
        store.record_event(e)
    store.close()
    return {"SLURM_SUPERVISOR_STATE_DIR": str(tmp_path)}


def _status(env: dict[str, str], *args: str) -> str:
    result = CliRunner().invoke(main, ["status", *args], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_one_run_on_one_screen(tmp_path):
    text = _status(_store(tmp_path), RUN)
    lines = text.splitlines()
    assert lines[0] == f"run {RUN}" and len(lines) <= 24
    rows = {line[2:19].strip(): line[19:] for line in lines[1:]}
    assert rows["state"].startswith("running since 2026-11-29 01:01:40 UTC (")
    assert rows["ETTR"].endswith("(1 incident)") and "%" in rows["ETTR"]
    assert rows["job"] == "501 (attempt 1) on 2 nodes"
    assert rows["restarts"] == "1 of 10"
    assert rows["last incident"].startswith(
        "2026-11-29 01:00:00 UTC, attempt 0: restart after node fault on n2; attempt 1 running 1 min 40 s later"
    )
    assert rows["last checkpoint"].startswith("step 200 verified 2026-11-29 01:30:00 UTC")
    assert rows["next checkpoint"].startswith("by 2026-11-29 02:00:00 UTC (")
    assert "every 30 min, from the [checkpoints] interval" in rows["next checkpoint"]
    assert rows["paging"] == "nothing"


def test_what_pages_shows_in_the_summary_and_the_table(tmp_path):
    env = _store(tmp_path, stale=True)
    assert "checkpoint_stale: run llama-70b: no verified checkpoint for 2 h" in _status(env, RUN)
    table = _status(env).splitlines()
    assert table[0].split() == ["RUN", "STATE", "SINCE", "ETTR", "JOB", "RESTARTS", "PAGING", "EXCLUDED"]
    assert RUN in table[1] and "1 open" in table[1] and "1 of 10" in table[1]


def test_unlimited_restarts_read_unlimited_everywhere(tmp_path):
    env = _store(tmp_path, max_restarts=1_000_000)
    assert "1000000" not in _status(env) and "1 of unlimited" in _status(env)
    assert "restarts         1 of unlimited" in _status(env, RUN)
    store = SqliteStore(tmp_path)
    run, attempts, events = store.get_run(RUN), store.attempts(RUN), store.events(RUN)
    store.close()
    html, md = render_html(run, attempts, events), render_markdown(run, attempts, events)
    assert "<b>1 of unlimited</b>" in html and "1000000" not in html and "1,000,000" not in html
    assert "restarts spent 1 of unlimited" in md and "1000000" not in md
    assert "1 of unlimited" in "\n".join(cli_render.status_lines([run]))


def test_numbers_read_as_people_write_them():
    assert restarts(1234, 1000) == "1,234 of 1,000" and restarts(3, 1_000_000) == "3 of unlimited"
    assert [duration(s) for s in (0.4, 45, 131, 3600, 3660, 11000, 200000)] == [
        "0 s",
        "45 s",
        "2 min 11 s",
        "1 h",
        "1 h 1 min",
        "3 h 3 min",
        "2 d 7 h",
    ]
    # the chronicle's durations (also on the HTML page): no "10800 s (3 h 0 min 0 s)"
    assert [seconds(s) for s in (4.7, 59, 10800, 9536, 200000)] == [
        "4.7 s",
        "59 s",
        "3 h",
        "2 h 38 min 56 s",
        "2 d 7 h 33 min 20 s",
    ]


def test_a_run_that_ended_is_summed_up_as_of_its_end(tmp_path):
    spec = RunSpec(name=RUN, script="/t.sbatch", partition="gpu", nodes=2)
    run = RunRecord(spec, RunState.COMPLETED, created_at=T0)
    from supervisor.report.summary import summarize

    events = [_ev(EventKind.COMPLETED, "job 500 completed", 7200)]
    s = summarize(run, [], events, now=T0 + 10**6)
    assert s.now == T0 + 7200 and s.since == T0 + 7200 and s.next_checkpoint is None and s.last_incident is None


def test_the_table_says_who_leads_the_instance_and_since_when(tmp_path):
    env = _store(tmp_path)
    assert "leader" not in _status(env)  # one daemon, no lease: nothing to say
    store = SqliteStore(tmp_path)
    store.claim_lease("login2:4242:ab\x1b[2J", "http://login2:8471", 15.0)
    store.close()
    last = _status(env).splitlines()[-1]
    assert last.startswith("leader: login2:4242:ab?[2J at http://login2:8471, epoch 1, since 20")
    assert "UTC; its lease holds 1" in last  # 14 or 15 s more
    assert _status(env, RUN).splitlines()[-1].startswith("leader: login2:4242:ab")
