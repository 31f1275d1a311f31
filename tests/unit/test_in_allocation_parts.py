"""In-allocation recovery's parts around the decision: the `[restart]` settings, the submission
(``--no-kill``, nodes + hot spares), the store's step records, the launcher channel's checks."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest
from test_config import MINIMAL_RUN, error_of, spec_in

from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.sqlite.schema import SCHEMA_VERSION
from supervisor.adapters.web.launcher_channel import LauncherChannel
from supervisor.adapters.web.messages import Request
from supervisor.config import load_run_spec
from supervisor.domain.actions import Submit, SwapStep
from supervisor.domain.alloc_step import StepGoal
from supervisor.domain.run import CheckpointPolicy, RestartMode
from supervisor.engine.act.intents import action_from, params_of, submit_request
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.kit.specs import spec


def test_in_allocation_mode_with_hot_spares_loads(tmp_path: Path) -> None:
    text = MINIMAL_RUN + '[restart]\nmode = "in-allocation"\nhot_spares = 2\nlauncher_timeout_s = 45\n'
    spec = load_run_spec(spec_in(tmp_path, text))
    assert (spec.restart_mode, spec.hot_spares, spec.launcher_timeout_s) == (RestartMode.IN_ALLOCATION, 2, 45.0)


@pytest.mark.parametrize(
    ("restart", "says"),
    [
        ('mode = "in-allocation"', "needs at least one hot spare"),
        ('mode = "in-allocation"\nhot_spares = 0', "needs at least one hot spare"),
        ("hot_spares = 1", 'only used with mode = "in-allocation"'),
        ('mode = "in-allocation"\nhot_spares = -1', "restart.hot_spares"),
        ('mode = "in-allocation"\nhot_spares = 1\nlauncher_timeout_s = 1', "restart.launcher_timeout_s"),
    ],
)
def test_in_allocation_settings_are_checked(tmp_path: Path, restart: str, says: str) -> None:
    assert says in error_of(spec_in(tmp_path, MINIMAL_RUN + f"[restart]\n{restart}\n"))


SPEC = spec(script="/s.sh", restart_mode=RestartMode.IN_ALLOCATION, hot_spares=1)


def test_the_job_holds_the_hot_spares_and_is_not_killed_by_a_node_failure() -> None:
    request = submit_request(SPEC, Submit("llm", (), restart=False, reason="first"), "tag", 0)
    assert request.nodes == 3 and request.extra_args[0] == "--no-kill" and not request.requeue
    assert request.env["SSV_RUN_NODES"] == "2"
    plain = submit_request(spec(script="/s.sh"), Submit("llm", (), False, "first"), "tag", 0)
    assert plain.nodes == 2 and "--no-kill" not in plain.extra_args and "SSV_RUN_NODES" not in plain.env


def test_a_swap_round_trips_through_the_journal() -> None:
    swap = SwapStep("llm", 7, 2, ("n1", "n3"), ("n2",), ("n3",), "n2 died")
    assert action_from("swap_step", json.loads(json.dumps(params_of(swap)))) == swap


def test_the_store_keeps_one_goal_per_generation_and_the_newest_wins(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path)
    store.add_run(SPEC, 1.0)
    assert int(store._db.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION
    assert store.step_goal("llm", 7) is None
    goal = StepGoal(7, 1, ("n1", "n3"), "n2 died", 10.0)
    assert store.set_step_goal("llm", goal) and not store.set_step_goal("llm", goal)  # a retry writes nothing
    store.set_step_goal("llm", StepGoal(7, 2, ("n1", "n4"), "n3 died", 20.0))
    assert store.step_goal("llm", 7).generation == 2 and store.step_goal("llm", 8) is None


def _channel(tmp_path: Path) -> tuple[LauncherChannel, SqliteStore]:
    store = SqliteStore(tmp_path)
    store.add_run(SPEC, 1.0)
    store.add_attempt("llm", 7, 0, 2.0)
    store.attempt_started("llm", 0, ("n1", "n2", "n3"), 3.0)
    return LauncherChannel({"llm": "secret-token"}, store, ManualClock(50.0)), store


def _post(channel: LauncherChannel, body: object, token: str = "secret-token", run: str = "llm"):  # noqa: ANN202
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"authorization": f"Bearer {token}"}
    return channel.handle(Request("POST", f"/v1/launcher/{run}", "", headers, data, "127.0.0.1"))


REPORT = {"job_id": 7, "generation": 0, "alive": True, "nodes": ["n1", "n2"], "host": "n1"}


def test_the_launcher_is_answered_with_the_goal_and_its_report_is_kept(tmp_path: Path) -> None:
    channel, store = _channel(tmp_path)
    first = _post(channel, REPORT)
    answer = json.loads(first.body)
    assert first.status == 200 and answer.pop("mac").startswith(
        "hmac-sha256:"
    )  # signed: tests/unit/test_launcher_goal_signed.py
    assert answer == {"job_id": 7, "generation": 0, "nodes": None, "env": {}}
    store.set_step_goal("llm", StepGoal(7, 1, ("n1", "n3"), "n2 died", 40.0))
    goal = json.loads(_post(channel, REPORT).body)
    assert (goal["generation"], goal["nodes"]) == (1, ["n1", "n3"])
    assert store.launcher_report("llm", 7).at == 50.0 and store.get_run("llm").step.report.host == "n1"


@pytest.mark.parametrize(
    ("body", "token", "status"),
    [
        (REPORT, "wrong-token", 403),
        (REPORT, "", 401),
        ({**REPORT, "job_id": 8}, "secret-token", 403),  # not the run's current job
        ({**REPORT, "host": "n9"}, "secret-token", 403),  # not a node of the job
        ({**REPORT, "nodes": ["n1"] * 20_000}, "secret-token", 400),  # over the schema's bounds
        ({**REPORT, "host": "n1;rm"}, "secret-token", 400),
        ({**REPORT, "extra": 1}, "secret-token", 400),
        (b"{not json", "secret-token", 400),
    ],
)
def test_the_channel_refuses_what_is_not_the_runs_launcher(tmp_path: Path, body, token, status) -> None:
    channel, store = _channel(tmp_path)
    assert _post(channel, body, token).status == status
    assert store.launcher_report("llm", 7) is None


def test_the_launchers_refusals_are_counted_with_the_servers(tmp_path: Path) -> None:
    """Issue 32 (the review's smaller points): a flood of refused launcher polls was invisible in
    the server's counters, which counted only the reports' refusals."""
    store = SqliteStore(tmp_path)
    store.add_run(SPEC, 1.0)
    store.add_attempt("llm", 7, 0, 2.0)
    store.attempt_started("llm", 0, ("n1", "n2", "n3"), 3.0)
    shared: Counter[str] = Counter({"reports": 5})
    channel = LauncherChannel({"llm": "secret-token"}, store, ManualClock(50.0), counters=shared)
    for token in ("wrong-token", "wrong-token", "", "secret-token"):
        _post(channel, REPORT, token)
    assert shared == Counter(reports=5, launcher_requests=4, launcher_rejected_403=2, launcher_rejected_401=1)


def test_an_answer_the_launcher_reads_is_bounded() -> None:
    from supervisor.adapters.web.launcher_channel import LauncherGoal

    too_many = {"job_id": 7, "generation": 1, "nodes": ["n1"], "env": {f"SSV_{i}": "x" for i in range(40)}}
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(json.dumps(too_many).encode(), type=LauncherGoal)


def test_a_run_that_saves_on_failure_tells_its_launcher_how_long_the_save_may_take() -> None:
    saving = replace(SPEC, checkpoints=CheckpointPolicy(root="/ckpt", save_on_failure_s=90.0))
    request = submit_request(saving, Submit("llm", (), restart=False, reason="first"), "tag", 0)
    assert request.env["SSV_SAVE_ON_FAILURE_S"] == "90"
    plain = submit_request(SPEC, Submit("llm", (), restart=False, reason="first"), "tag", 0)
    assert "SSV_SAVE_ON_FAILURE_S" not in plain.env
