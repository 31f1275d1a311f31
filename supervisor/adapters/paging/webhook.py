"""Paging: page-worthy logbook events to a webhook, as Slack or PagerDuty Events v2 JSON.

* :class:`Pager` (no I/O) turns events into alerts: a run that gave up, a mass fault, no verified
  checkpoint for too long (``checkpoint_stale``), repeated rollbacks. Every incident has a dedup
  key; it is triggered once, and closed (``resolve``) by the event that ends it: a verified
  checkpoint closes the stale-checkpoint page, a later attempt running closes a mass fault (one
  page per incident, not per attempt: keyed by the incident's event), the run completing or being
  cancelled closes them all.
* :class:`WebhookNotifier` delivers them: a bounded queue (the oldest alert is dropped, and
  counted, when it is full), a timeout per request, retries with backoff on timeouts, refused
  connections, 429 and 5xx. The URL (and PagerDuty's routing key) is a secret: it is read from a
  file and never logged or shown.
* ``notify_new_events(store, notifier, after_id)`` is what the daemon loop calls every tick: it
  reads only the events recorded since the last call (by their number in the logbook).
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from supervisor.adapters.paging.payload import FORMATS, Alert
from supervisor.adapters.paging.payload import payload as payload  # the bodies are built there
from supervisor.adapters.secrets import read_secret as read_secret  # where the notifier's secrets are read
from supervisor.domain.records import Event, EventKind

log = structlog.get_logger(__name__)

PAGE_KINDS = frozenset(
    {
        "gave_up",
        "mass_fault",
        "checkpoint_stale",
        "repeated_rollbacks",
        "rollback_blocked",
        "slowdown",
        "stuck",
        "crash_loop",
    }
)
_ENDS = frozenset({EventKind.COMPLETED, EventKind.CANCELLED})


@dataclass(frozen=True)
class PagerSettings:
    kinds: frozenset[str] = PAGE_KINDS
    rollbacks: int = 3  # this many rollbacks of one run ...
    rollback_window_s: float = 86400.0  # ... within this window page

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - PAGE_KINDS)
        if unknown:
            raise ValueError(
                f"[notify] kinds: unknown {', '.join(unknown)}; choose from {', '.join(sorted(PAGE_KINDS))}"
            )


class Pager:
    """Events in, alerts out; remembers open incidents so that each pages once."""

    def __init__(self, settings: PagerSettings | None = None) -> None:
        self.settings = settings or PagerSettings()
        self.open: dict[str, Alert] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._rollbacks: dict[str, deque[float]] = {}

    def feed(self, events: Iterable[Event]) -> list[Alert]:
        out: list[Alert] = []
        for e in sorted(events, key=lambda x: x.at):
            if e.key in self._seen:
                continue
            self._seen[e.key] = None
            if len(self._seen) > 100_000:
                self._seen.popitem(last=False)
            out += self._one(e)
        return out

    def _one(self, e: Event) -> list[Alert]:
        kind = e.kind.value
        if kind == "gave_up":
            return self._trigger(f"{e.run}:gave_up", "gave_up", e, f"run {e.run} gave up: {e.message}")
        if kind == "mass_fault":
            return self._mass_fault(e)
        if kind == "checkpoint_stale":
            return self._trigger(f"{e.run}:checkpoint_stale", "checkpoint_stale", e, f"run {e.run}: {e.message}")
        if kind == "rollback":
            return self._rollback(e)
        if kind == "slowdown":
            return self._trigger(f"{e.run}:slowdown:{e.attempt}", "slowdown", e, f"run {e.run}: {e.message}")
        if kind == "rollback_blocked":
            return self._trigger(
                f"{e.run}:rollback_blocked:{e.attempt}",
                "rollback_blocked",
                e,
                f"run {e.run}: a loss spike did not heal and was not rolled back: {e.message}",
            )
        if kind == "crash_loop":
            return self._trigger(f"{e.run}:crash_loop", "crash_loop", e, f"run {e.run}: {e.message}")
        if kind == "stuck":
            return self._trigger(f"{e.run}:stuck", "stuck", e, f"run {e.run} cannot be placed: {e.message}")
        if kind == "checkpoint_verified":
            return self._resolve(lambda a: a.run == e.run and a.kind == "checkpoint_stale", e)
        if e.kind is EventKind.STARTED:  # a run placed again; a later attempt closes its attempt's pages
            return self._resolve(lambda a: a.run == e.run and (a.kind == "stuck" or _older_attempt(a, e)), e)
        if e.kind in _ENDS:
            return self._resolve(lambda a: a.run == e.run, e)
        return []

    def _mass_fault(self, e: Event) -> list[Alert]:
        """One page per incident: keyed by the incident's logbook event (``RUN:mass_fault:ATTEMPT``,
        the attempt it began on); while a mass-fault page of the run is open, a further event joins it."""
        if any(a.run == e.run and a.kind == "mass_fault" for a in self.open.values()):
            return []
        key = e.key if e.key.startswith(f"{e.run}:mass_fault:") else f"{e.run}:mass_fault:{e.attempt}"
        return self._trigger(key, "mass_fault", e, f"run {e.run}: mass fault, a human decides: {e.message}")

    def _rollback(self, e: Event) -> list[Alert]:
        times = self._rollbacks.setdefault(e.run, deque())
        times.append(e.at)
        while times and times[0] < e.at - self.settings.rollback_window_s:
            times.popleft()
        if len(times) < self.settings.rollbacks:
            return []
        hours = self.settings.rollback_window_s / 3600
        return self._trigger(
            f"{e.run}:repeated_rollbacks",
            "repeated_rollbacks",
            e,
            f"run {e.run}: {len(times)} rollbacks within {hours:g} h; latest: {e.message}",
        )

    def _trigger(self, key: str, kind: str, e: Event, summary: str) -> list[Alert]:
        if kind not in self.settings.kinds or key in self.open:
            return []
        alert = Alert(
            key,
            "trigger",
            e.run,
            kind,
            summary[:1000],
            e.at,
            {
                "attempt": e.attempt,
                "job_id": e.job_id,
                "event": e.kind.value,
                "message": e.message,
                "evidence": dict(e.evidence),
            },
        )
        self.open[key] = alert
        return [alert]

    def _resolve(self, which: Any, e: Event) -> list[Alert]:
        done = [a for a in self.open.values() if which(a)]
        for a in done:
            del self.open[a.dedup_key]
        return [
            Alert(
                a.dedup_key,
                "resolve",
                a.run,
                a.kind,
                f"resolved: {a.summary[:900]} — {e.message}",
                e.at,
                {"resolved_by": e.kind.value},
            )
            for a in done
        ]


def _older_attempt(alert: Alert, started: Event) -> bool:
    return (
        alert.kind in ("mass_fault", "rollback_blocked", "slowdown")
        and started.attempt is not None
        and alert.details.get("attempt") != started.attempt
    )


# ---------------------------------------------------------------- delivery


class WebhookNotifier:
    """Posts alerts to one webhook. ``send`` only queues; ``flush`` (or the thread ``start`` runs) delivers."""

    def __init__(
        self,
        url: str,
        fmt: str = "slack",
        *,
        routing_key: str | None = None,
        pager: Pager | None = None,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        queue_max: int = 1000,
        source: str | None = None,
    ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"[notify] format {fmt!r}: choose one of {', '.join(FORMATS)}")
        if fmt == "pagerduty" and not routing_key:
            raise ValueError('[notify] format = "pagerduty" needs routing_key_file (the integration key)')
        if not url.startswith(("http://", "https://")):
            raise ValueError("[notify] the webhook URL (webhook_url_file) must start with https:// or http://")
        self._url, self._key = url, routing_key
        self.fmt, self.pager = fmt, pager or Pager()
        self.timeout_s, self.retries, self.backoff_s, self.source = timeout_s, retries, backoff_s, source
        self._queue: deque[Alert] = deque(maxlen=queue_max)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = self.failed = self.dropped = 0

    def __repr__(self) -> str:
        return f"WebhookNotifier(format={self.fmt!r}, url=<secret>, queued={len(self._queue)})"

    def send(self, alert: Alert) -> None:
        with self._lock:
            if len(self._queue) == self._queue.maxlen:
                self.dropped += 1
                log.warning("notify.dropped", dedup_key=self._queue[0].dedup_key, reason="queue full")
            self._queue.append(alert)
        self._wake.set()

    def flush(self) -> int:
        """Deliver everything queued, in this thread; returns how many were delivered."""
        done = 0
        while not self._stop.is_set():
            with self._lock:
                if not self._queue:
                    return done
                alert = self._queue.popleft()
            done += self._deliver(alert)
        return done

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="slurm-supervisor-notify", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            self.flush()

    def _deliver(self, alert: Alert) -> int:
        body = json.dumps(payload(alert, self.fmt, self._key, self.source)).encode()
        for attempt in range(self.retries + 1):
            status, why = self._post(body)
            if status is not None and 200 <= status < 300:
                self.sent += 1
                log.info("notify.sent", dedup_key=alert.dedup_key, action=alert.action, status=status)
                return 1
            retry = status is None or status == 429 or status >= 500
            if not retry or attempt == self.retries or self._stop.wait(self.backoff_s * 2**attempt):
                break
            log.info("notify.retry", dedup_key=alert.dedup_key, attempt=attempt + 1, reason=why)
        self.failed += 1
        log.error("notify.failed", dedup_key=alert.dedup_key, action=alert.action, reason=why, attempts=attempt + 1)
        return 0

    def _post(self, body: bytes) -> tuple[int | None, str]:
        request = urllib.request.Request(  # noqa: S310 - the URL is checked to be http(s) at config load
            self._url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "slurm-supervisor"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:  # noqa: S310 - http(s) only
                return int(answer.status), "ok"
        except urllib.error.HTTPError as exc:
            return exc.code, f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            return None, self._redact(f"{type(reason).__name__}: {reason}")

    def _redact(self, text: str) -> str:
        for secret in (self._url, self._key):
            if secret:
                text = text.replace(secret, "<secret>")
        return text


class EventLog(Protocol):
    """What the pager reads of the logbook: the events recorded after a given one."""

    def events_after(self, after_id: int, limit: int = 1000) -> tuple[int, list[Event]]: ...


def notify_new_events(store: EventLog, notifier: WebhookNotifier, after_id: int, batch: int = 1000) -> int:
    """Page for the events recorded after the one numbered ``after_id``; returns the number of the
    last one read, the cursor for the next call.

    Start the daemon with ``store.last_event_id()`` so that old events do not page again. Only new
    events are read: a tick's cost does not grow with the logbook."""
    while True:
        last, events = store.events_after(after_id, batch)
        for alert in notifier.pager.feed(events):
            notifier.send(alert)
        if len(events) < batch:
            return last
        after_id = last
