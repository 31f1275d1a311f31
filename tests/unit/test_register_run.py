"""One run registration (engine.act.register): the API, the simulator and the demo all write a run
and its REGISTERED line through it."""

import pytest

from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.records import EventKind
from supervisor.engine.act.register import register_run
from supervisor.ports import PermanentError
from supervisor.testing.kit.specs import spec


def test_the_run_and_its_registered_line_are_written_with_who_asked(tmp_path):
    store = SqliteStore(tmp_path)
    register_run(store, spec(name="llm"), 1000.0, actor="alice", message="run registered by alice", owner_uid=1001)
    [event] = store.events("llm")
    assert (event.kind, event.actor, event.message, event.at) == (
        EventKind.REGISTERED,
        "alice",
        "run registered by alice",
        1000.0,
    )
    assert store.get_run("llm") is not None


def test_a_name_taken_is_refused_and_logs_nothing_more(tmp_path):
    store = SqliteStore(tmp_path)
    register_run(store, spec(name="llm"), 1000.0, actor="alice", message="first")
    with pytest.raises(PermanentError, match="already supervised"):
        register_run(store, spec(name="llm"), 1001.0, actor="bob", message="second")
    assert [e.message for e in store.events("llm")] == ["first"]
