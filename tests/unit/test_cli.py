"""The CLI as people use it: bad input is refused with a clear message and changes nothing.

Changes go through the instance's local API (served here in-process over the state directory,
as the daemon serves it); reads too while it answers."""

import json

import pytest
from click.testing import CliRunner

from supervisor.adapters.sqlite import SqliteStore
from supervisor.api.testing import local_api
from supervisor.cli import main

GOOD = """
[run]
name = "llm"
script = "train.sbatch"
partition = "main"
nodes = 2
[spares]
policy = "named"
nodes = "n[3-4]"
"""


@pytest.fixture
def env(tmp_path):
    (tmp_path / "train.sbatch").write_text("#!/bin/bash\nsrun true\n")
    state = tmp_path / "state"
    with local_api(state):
        yield tmp_path, {"SLURM_SUPERVISOR_STATE_DIR": str(state)}, state


def invoke(env_vars, *args):
    return CliRunner().invoke(main, list(args), env=env_vars, catch_exceptions=False)


def submit(tmp_path, env_vars, text):
    spec = tmp_path / "run.toml"
    spec.write_text(text)
    return invoke(env_vars, "submit", "--no-slurm-check", str(spec))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[run\nname = 'x'", "run.toml"),
        (GOOD + "\n[restart]\nmax_restart = 3\n", "max_restarts"),
        (GOOD.replace("train.sbatch", "missing.sbatch"), "missing.sbatch"),
        (GOOD.replace('"n[3-4]"', '"n[3-"'), "spares.nodes"),
        (GOOD.replace("nodes = 2", "nodes = 0"), "run.nodes"),
    ],
    ids=["malformed-toml", "unknown-key", "missing-script", "bad-hostlist", "zero-nodes"],
)
def test_bad_run_spec_is_refused_and_changes_nothing(env, text, expected):
    tmp_path, env_vars, state = env
    result = submit(tmp_path, env_vars, text)
    assert result.exit_code == 1
    assert expected in result.output and "Fix:" in result.output
    assert "Traceback" not in result.output
    assert SqliteStore(state).runs() == []


def test_submit_status_logbook_cancel(env):
    tmp_path, env_vars, state = env
    result = submit(tmp_path, env_vars, GOOD)
    assert result.exit_code == 0, result.output
    again = submit(tmp_path, env_vars, GOOD)
    assert again.exit_code == 1 and "already supervised" in again.output
    status = json.loads(invoke(env_vars, "status", "--json").output)
    assert status[0]["name"] == "llm" and status[0]["state"] == "registered"
    assert status[0]["restarts"] == {"spent": 0, "limit": 10}
    table = invoke(env_vars, "status").output
    assert "llm" in table and "registered" in table
    book = invoke(env_vars, "logbook", "llm").output
    assert "registered" in book and "2 nodes on main" in book
    assert invoke(env_vars, "cancel", "llm").exit_code == 0
    assert SqliteStore(state).get_run("llm").cancel_requested
    unknown = invoke(env_vars, "logbook", "nope")
    assert unknown.exit_code == 1 and "unknown run 'nope'" in unknown.output
    assert "no node has been drained" in invoke(env_vars, "nodes").output


def test_bad_daemon_config_names_file_and_key(tmp_path):
    cfg = tmp_path / "supervisor.toml"
    cfg.write_text("[daemon]\npoll_interval = 5\n")
    result = invoke({}, "--config", str(cfg), "status")
    assert result.exit_code == 1
    assert "supervisor.toml" in result.output and "poll_interval_s" in result.output


def test_demo_recovers_and_prints_the_logbook():
    result = invoke({}, "demo", "--hours", "6", "--crashes", "2")
    assert result.exit_code == 0, result.output
    assert "LOGBOOK" in result.output and "restarted as job" in result.output
    assert "downed and drained in Slurm" in result.output
    assert "overlapping incarnations: 0" in result.output


def test_logbook_note_is_signed_and_shown(env):
    tmp_path, env_vars, state = env
    assert submit(tmp_path, env_vars, GOOD).exit_code == 0
    added = invoke(env_vars, "logbook", "note", "llm", "swapped the IB cable on n2")
    assert added.exit_code == 0, added.output
    events = SqliteStore(state).events("llm")
    note = events[-1]
    assert note.kind.value == "note" and note.message == "swapped the IB cable on n2" and note.actor
    shown = invoke(env_vars, "logbook", "llm").output
    assert "swapped the IB cable on n2" in shown and f"[{note.actor}]" in shown
    assert "[" + note.actor + "]" in invoke(env_vars, "logbook", "llm", "--format", "markdown").output
    assert invoke(env_vars, "logbook", "show", "llm").output == shown
    empty = invoke(env_vars, "logbook", "note", "llm", "  ")
    assert empty.exit_code == 1 and "empty" in empty.output


def test_quarantine_lists_repeat_offenders_and_clear_ends_it(tmp_path):
    from supervisor.domain.health.quarantine import Fault
    from supervisor.domain.run import RunSpec

    state = tmp_path / "state"
    store = SqliteStore(state)
    now = __import__("time").time()
    spec = RunSpec(name="a", script="/x", partition="p", nodes=1)
    store.add_run(spec, now)
    for i in range(2):
        store.record_node_fault(Fault("gpu-7", now - 3600 * (i + 1), "a", f"XID 79 (#{i})", key=f"k{i}"))
    runner = CliRunner()
    out = runner.invoke(main, ["--state-dir", str(state), "quarantine", "list"])  # read straight: no daemon
    assert out.exit_code == 0 and out.output.startswith("gpu-7  until ") and "XID 79 (#0)" in out.output
    out = runner.invoke(main, ["--state-dir", str(state), "quarantine", "clear", "gpu-7", "--note", "GPU replaced"])
    assert out.exit_code == 1 and "no slurm-supervisor daemon answers" in out.output  # changes need the daemon
    with local_api(state):
        out = runner.invoke(main, ["--state-dir", str(state), "quarantine", "clear", "gpu-7", "--note", "GPU replaced"])
        assert out.exit_code == 0 and "cleared" in out.output
        out = runner.invoke(main, ["--state-dir", str(state), "quarantine", "list"])
    assert out.output.strip() == "no node is quarantined"
    assert store.quarantine_clears().keys() == {"gpu-7"}
