"""The webhook notifier against a real HTTP server on loopback (http.server), not mocks."""

import json
import threading
import time
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.paging.webhook import (
    Pager,
    PagerSettings,
    WebhookNotifier,
    notify_new_events,
    payload,
    read_secret,
)
from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.records import Event, EventKind
from supervisor.testing.kit.specs import spec

T0 = 1795910400.0
SECRET = "T000/B000/s3cr3t-token-do-not-log"


class Hook:
    """A webhook receiver: records every POST; answers with the queued statuses (then 200)."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.statuses: list[int] = []
        self.delay_s = 0.0
        self.got = threading.Event()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.posts.append({"path": self.path, "type": self.headers["Content-Type"], "json": json.loads(body)})
                if hook.delay_s:
                    time.sleep(hook.delay_s)  # the server side of a slow webhook, not the code under test
                status = hook.statuses.pop(0) if hook.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                hook.got.set()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/{SECRET}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def bodies(self) -> list[dict]:
        return [p["json"] for p in self.posts]


@pytest.fixture
def hook():
    h = Hook()
    h.thread.start()
    yield h
    h.server.shutdown()
    h.server.server_close()


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path)
    s.add_run(spec(name="llama-70b", script="train.sbatch", partition="gpu"), T0)
    yield s
    s.close()


def _ev(kind, at, attempt=0, message="", key=None, **evidence):
    return Event(
        "llama-70b",
        kind,
        message or str(kind),
        key or f"{kind}:{at}",
        T0 + at,
        attempt,
        100 + attempt,
        evidence=evidence,
    )


def test_gave_up_pages_once_in_slack_format(hook, store):
    notifier = WebhookNotifier(hook.url, "slack", backoff_s=0.01)
    store.record_event(_ev(EventKind.STARTED, 0))
    store.record_event(_ev(EventKind.GAVE_UP, 100, message="restart budget spent (5 of 5); giving up"))
    cursor = notify_new_events(store, notifier, 0)
    assert cursor == store.last_event_id() == 2
    assert notifier.flush() == 1
    assert notify_new_events(store, notifier, cursor) == cursor and notifier.flush() == 0  # the same incident
    (body,) = hook.bodies()
    assert hook.posts[0]["type"] == "application/json"
    assert "run llama-70b gave up: restart budget spent" in body["text"] and body["text"].startswith(":rotating_light:")
    assert "dedup `llama-70b:gave_up`" in json.dumps(body["blocks"])


class CountingStore(SqliteStore):
    """The real store, counting the logbook events each read hands back."""

    read = 0

    def events(self, run=None):
        out = super().events(run)
        self.read += len(out)
        return out

    def events_after(self, after_id, limit=1000):
        last, out = super().events_after(after_id, limit)
        self.read += len(out)
        return last, out


def test_a_tick_reads_only_the_events_recorded_since_the_last(tmp_path):
    """A long run's logbook holds tens of thousands of events: the pager's per-tick cost must not
    grow with it (security review finding #17: it read every event every tick)."""
    store = CountingStore(tmp_path)
    with store.transaction():  # one commit for the history, not 5,000
        for i in range(5000):
            store.record_event(_ev(EventKind.CHECKPOINT_VERIFIED, i, key=f"v{i}"))
    notifier = WebhookNotifier("https://hooks.example/x", "slack")
    cursor = store.last_event_id()  # the daemon starts here: old events do not page again
    store.read = 0
    for _ in range(10):
        cursor = notify_new_events(store, notifier, cursor)
    assert store.read == 0
    store.record_event(_ev(EventKind.GAVE_UP, 6000, message="budget spent", key="g"))
    store.record_event(_ev(EventKind.STARTED, -10, key="late"))  # stamped earlier, recorded later: still read
    cursor = notify_new_events(store, notifier, cursor)
    assert store.read == 2 and cursor == store.last_event_id()
    assert [a.kind for a in notifier._queue] == ["gave_up"]
    store.close()


def test_stale_checkpoint_triggers_once_and_a_verified_checkpoint_resolves_it_pagerduty(hook, store):
    notifier = WebhookNotifier(hook.url, "pagerduty", routing_key="R0UT1NG", backoff_s=0.01, source="login1")
    store.record_event(_ev(EventKind.CHECKPOINT_STALE, 10, message="no verified checkpoint for 3.0 h", key="s1"))
    store.record_event(_ev(EventKind.CHECKPOINT_STALE, 20, message="no verified checkpoint for 3.5 h", key="s2"))
    cursor = notify_new_events(store, notifier, 0)
    store.record_event(_ev(EventKind.CHECKPOINT_VERIFIED, 30, message="checkpoint step 900 verified", step=900))
    notify_new_events(store, notifier, cursor)
    assert notifier.flush() == 2
    trigger, resolve = hook.bodies()
    assert trigger["event_action"] == "trigger" and resolve["event_action"] == "resolve"
    assert trigger["dedup_key"] == resolve["dedup_key"] == "llama-70b:checkpoint_stale"
    assert trigger["routing_key"] == "R0UT1NG"
    p = trigger["payload"]
    assert (p["severity"], p["source"], p["component"], p["class"]) == (
        "error",
        "login1",
        "llama-70b",
        "checkpoint_stale",
    )
    assert p["timestamp"].startswith("2026-11-29T00:00:10") and "3.0 h" in p["summary"]
    assert "payload" not in resolve


def test_server_errors_are_retried_and_client_errors_are_not(hook):
    notifier = WebhookNotifier(hook.url, "slack", backoff_s=0.01, retries=3)
    pager = notifier.pager
    hook.statuses = [503, 500]
    for alert in pager.feed([_ev(EventKind.GAVE_UP, 1)]):
        notifier.send(alert)
    assert notifier.flush() == 1 and len(hook.posts) == 3 and notifier.sent == 1
    hook.statuses = [400]
    for alert in pager.feed([_ev(EventKind.COMPLETED, 2)]):  # resolves the gave_up incident
        notifier.send(alert)
    assert notifier.flush() == 0 and len(hook.posts) == 4 and notifier.failed == 1


@pytest.mark.timing
def test_a_slow_webhook_times_out_and_the_secret_is_never_logged(hook):
    hook.delay_s = 1.0
    notifier = WebhookNotifier(hook.url, "slack", timeout_s=0.2, retries=1, backoff_s=0.01)
    with capture_logs() as logs:
        for alert in notifier.pager.feed([_ev(EventKind.GAVE_UP, 1)]):
            notifier.send(alert)
        started = time.monotonic()
        assert notifier.flush() == 0
        elapsed = time.monotonic() - started
    assert elapsed < 0.9 and notifier.failed == 1
    failed = [entry for entry in logs if entry["event"] == "notify.failed"]
    assert failed and "timed out" in failed[0]["reason"].lower()
    assert SECRET not in repr(logs) and SECRET not in repr(notifier)


def test_refused_connection_is_retried_then_reported_without_the_url():
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as closed:
        port = closed.server_address[1]
    url = f"http://127.0.0.1:{port}/hook/{SECRET}"
    notifier = WebhookNotifier(url, "slack", retries=2, backoff_s=0.01)
    with capture_logs() as logs:
        for alert in notifier.pager.feed([_ev(EventKind.GAVE_UP, 1)]):
            notifier.send(alert)
        notifier.flush()
    assert [e["event"] for e in logs].count("notify.retry") == 2 and notifier.failed == 1
    assert SECRET not in repr(logs) and str(port) not in repr([e for e in logs if e["event"] == "notify.failed"])


def test_the_queue_is_bounded_oldest_dropped(hook):
    notifier = WebhookNotifier(hook.url, "slack", queue_max=2)
    events = [Event(f"run-{i}", EventKind.GAVE_UP, "gave up", f"g{i}", T0 + i, 0, 1) for i in range(3)]
    for alert in notifier.pager.feed(events):
        notifier.send(alert)
    assert notifier.dropped == 1 and notifier.flush() == 2
    assert ["run run-1" in b["text"] or "run run-2" in b["text"] for b in hook.bodies()] == [True, True]


def test_the_background_thread_delivers(hook):
    notifier = WebhookNotifier(hook.url, "slack")
    notifier.start()
    try:
        for alert in notifier.pager.feed([_ev(EventKind.GAVE_UP, 1)]):
            notifier.send(alert)
        assert hook.got.wait(10), "the notifier thread did not post"
    finally:
        notifier.close()
    assert len(hook.posts) == 1


class _Later(StrEnum):  # the rollback kind the spike issue adds; the pager matches kinds by value
    ROLLBACK = "rollback"


def test_repeated_rollbacks_page_once_within_the_window_and_close_with_the_run():
    pager = Pager(PagerSettings(rollbacks=3, rollback_window_s=3600))
    rb = [
        Event("r", _Later.ROLLBACK, f"rolled back to step {s}", f"rb{s}", T0 + t, 0, 1)  # type: ignore[arg-type]
        for s, t in ((100, 0), (200, 4000), (300, 4100), (400, 4200), (500, 4300))
    ]
    assert pager.feed(rb[:2]) == []  # two rollbacks, and more than an hour apart
    (alert,) = pager.feed(rb[2:])  # three within an hour: one page, the fourth and fifth join it
    assert (alert.kind, alert.action, alert.dedup_key) == ("repeated_rollbacks", "trigger", "r:repeated_rollbacks")
    (closed,) = pager.feed([Event("r", EventKind.COMPLETED, "job 1 completed", "c", T0 + 9000, 0, 1)])
    assert closed.action == "resolve" and closed.dedup_key == alert.dedup_key


def test_mass_fault_closes_when_a_later_attempt_runs_and_kinds_can_be_chosen():
    pager = Pager(PagerSettings(kinds=frozenset({"mass_fault"})))
    assert pager.feed([Event("r", EventKind.GAVE_UP, "x", "g", T0, 0, 1)]) == []  # not a chosen kind
    (t,) = pager.feed([Event("r", EventKind.MASS_FAULT, "9 nodes at once", "m", T0, 0, 1)])
    assert pager.feed([Event("r", EventKind.STARTED, "running", "s0", T0 + 1, 0, 1)]) == []  # same attempt
    (r,) = pager.feed([Event("r", EventKind.STARTED, "running", "s1", T0 + 2, 1, 2)])
    assert (t.action, r.action, r.dedup_key) == ("trigger", "resolve", "r:mass_fault:0")
    with pytest.raises(ValueError, match="unknown nonsense"):
        PagerSettings(kinds=frozenset({"nonsense"}))


def test_a_mass_fault_pages_once_per_incident_keyed_by_the_incidents_event():
    pager = Pager()
    first = Event("r", EventKind.MASS_FAULT, "4 nodes at once", "r:mass_fault:3", T0, 3, 13)
    again = Event("r", EventKind.MASS_FAULT, "2 more nodes", "r:mass_fault:4", T0 + 5, 4, 14)
    (t,) = pager.feed([first, again])  # a second event while the page is open joins it
    assert (t.action, t.dedup_key) == ("trigger", "r:mass_fault:3")
    (r,) = pager.feed([Event("r", EventKind.STARTED, "running", "s5", T0 + 60, 5, 15)])
    assert (r.action, r.dedup_key) == ("resolve", "r:mass_fault:3")
    assert pager.feed([again]) == []  # the same event again pages nothing
    later = Event("r", EventKind.MASS_FAULT, "a new incident", "r:mass_fault:9", T0 + 86400, 9, 19)
    assert [(a.action, a.dedup_key) for a in pager.feed([later])] == [("trigger", "r:mass_fault:9")]


def test_secret_files_and_bad_settings_get_clear_errors(tmp_path):
    f = tmp_path / "url"
    f.write_text(f"https://hooks.example/{SECRET}\n")
    f.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_secret(f)
    f.chmod(0o600)
    assert read_secret(f) == f"https://hooks.example/{SECRET}"
    with pytest.raises(ValueError, match="cannot read it"):
        read_secret(tmp_path / "missing")
    with pytest.raises(ValueError, match="routing_key_file"):
        WebhookNotifier("https://events.example/v2/enqueue", "pagerduty")
    with pytest.raises(ValueError, match="choose one of slack, pagerduty"):
        WebhookNotifier("https://x.example", "teams")
    with pytest.raises(ValueError, match="must start with https://"):
        WebhookNotifier("hooks.example/x", "slack")
    assert payload(Pager().feed([_ev(EventKind.GAVE_UP, 1)])[0], "slack")["text"]
