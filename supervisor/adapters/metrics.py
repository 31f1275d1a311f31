"""Prometheus metrics from the store, so they are never out of step with the logbook and a daemon
restart loses nothing.

``StoreCollector`` reads the store when it is collected. Its cost does not grow with the whole
history: a run that has ended (a terminal state and its end on record) is read once and its
figures kept until its newest event changes; only active runs are read again. The daemon does not
collect per scrape either: ``supervisor.adapters.web.pages`` answers ``GET /metrics`` from a copy
rendered at most once per engine tick, in the page renderer's child process.

``metrics_page(store, now)`` (status, headers, body) and ``metrics_text`` collect once. Metric names
(all prefixed ``slurm_supervisor_``) are documented in docs/observability.md;
deploy/prometheus/alerts.yml and deploy/grafana/slurm-supervisor.json use them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from supervisor.domain.goodput.account import KINDS, Goodput, goodput
from supervisor.domain.records import Event, EventKind, RunRecord, Verdict
from supervisor.domain.run import RunState
from supervisor.ports import Store
from supervisor.report.chronicle import last_record

P = "slurm_supervisor_"
DETECTION_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
RECOVERY_BUCKETS = (5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0)
VERIFIED = "checkpoint_verified"
ALL_KINDS = tuple(EventKind)
_ENDS = frozenset({EventKind.COMPLETED, EventKind.GAVE_UP, EventKind.CANCELLED})
# Counted from 0 for every run, so Prometheus' increase() sees a run's first one (a series born at 1 has no
# earlier sample to increase from): the kinds deploy/prometheus/alerts.yml and the Grafana dashboard watch.
ZERO_KINDS = tuple(
    k.value
    for k in (
        EventKind.GAVE_UP,
        EventKind.MASS_FAULT,
        EventKind.ROLLBACK,
        EventKind.CRASH_LOOP,
        EventKind.CHECKPOINT_STALE,
        EventKind.FAULT,
        EventKind.STORE_OUTAGE,
    )
)


@dataclass(frozen=True)
class RunFigures:
    """What the metrics need of one run, read from its attempts and events."""

    run: RunRecord
    account: Goodput | None  # None before the first attempt
    events: dict[str, int]  # logbook events by kind
    newest_verified: float | None  # when the newest verified checkpoint was first verified
    first_start: float | None  # when the first attempt started
    ended: bool  # its end is on record: the figures no longer change with the clock


def run_figures(store: Store, run: RunRecord, now: float) -> RunFigures:
    attempts, events = store.attempts(run.name), store.events(run.name)
    end = max(now, last_record(attempts, events))
    account = goodput(run.name, attempts, events, now=end, series=store.progress(run.name)) if attempts else None
    counts: dict[str, int] = {}
    for e in events:
        counts[e.kind.value] = counts.get(e.kind.value, 0) + 1
    started = [a.started_at for a in attempts if a.started_at is not None]
    ended = run.state.terminal and any(e.kind in _ENDS for e in events)
    return RunFigures(run, account, counts, _newest_verified(events), min(started, default=None), ended)


class StoreCollector:
    """A prometheus_client collector over a Store; ``now`` is a clock's ``now``. Keep one to reuse
    the figures of runs that have ended."""

    def __init__(self, store: Store, now: Callable[[], float]) -> None:
        self.store = store
        self.now = now
        self._ended: dict[str, tuple[tuple[object, ...], RunFigures]] = {}

    def figures(self, run: RunRecord, now: float) -> RunFigures:
        last = self.store.last_event(run.name, ALL_KINDS) if run.state.terminal else None
        mark = (run.state, last.key if last else None, last.at if last else None)
        kept = self._ended.get(run.name)
        if kept is not None and kept[0] == mark:
            return replace(kept[1], run=run)
        figures = run_figures(self.store, run, now)
        if figures.ended:
            self._ended[run.name] = (mark, figures)
        return figures

    def collect(self) -> Iterator[Metric]:
        now = self.now()
        runs = self.store.runs()
        per_run = [self.figures(r, now) for r in runs]
        yield _runs_by_state(runs)
        yield _drained(self.store)
        accounts = [(f.run, f.account) for f in per_run if f.account is not None]
        yield from _goodput_metrics(accounts)
        yield _event_counts(per_run)
        yield from _checkpoint_age(per_run, now)
        interruptions = [i for _, g in accounts for i in g.interruptions]
        yield _histogram(
            "detection_latency_seconds",
            "Seconds from a fault's onset to the supervisor knowing "
            "(where the onset is on record, e.g. a hang's silent time).",
            [i.detection_s for i in interruptions if i.detection_s is not None],
            DETECTION_BUCKETS,
        )
        yield _histogram(
            "recovery_latency_seconds",
            "Seconds from a fault's detection to the next attempt running.",
            [i.recovery_s for i in interruptions if i.recovery_s is not None],
            RECOVERY_BUCKETS,
        )


def collector_text(collector: StoreCollector) -> bytes:
    """The exposition text of every metric the collector gives, now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def metrics_text(store: Store, now: float) -> bytes:
    """The exposition text of every metric, now."""
    return collector_text(StoreCollector(store, lambda: now))


HEADERS = [("Content-Type", CONTENT_TYPE_LATEST), ("Cache-Control", "no-store")]


def metrics_page(store: Store, now: float) -> tuple[int, list[tuple[str, str]], bytes]:
    """A read-only HTTP answer for ``GET /metrics``: (status, headers, body)."""
    return 200, list(HEADERS), metrics_text(store, now)


# ---------------------------------------------------------------- families


def _runs_by_state(runs: Sequence[RunRecord]) -> Metric:
    fam = GaugeMetricFamily(P + "runs", "Supervised runs by state.", labels=["state"])
    for state in RunState:
        fam.add_metric([state.value], sum(1 for r in runs if r.state is state))
    return fam


def _drained(store: Store) -> Metric:
    fam = GaugeMetricFamily(
        P + "bad_nodes",
        "Nodes judged bad by the supervisor, by what was done "
        "(down, drained: in Slurm; excluded: kept out of the run only).",
        labels=["action"],
    )
    counts = {"down": 0, "drained": 0, "excluded": 0}
    for v in store.verdicts():
        if v.verdict is Verdict.BAD:
            action = v.action if v.action in counts else "excluded"
            counts[action] += 1
    for action, n in sorted(counts.items()):
        fam.add_metric([action], n)
    return fam


def _goodput_metrics(accounts: Sequence[tuple[RunRecord, Goodput]]) -> Iterator[Metric]:
    ettr = GaugeMetricFamily(
        P + "ettr",
        "Effective training time ratio: productive / wall time since the first "
        "submission (an upper bound where work lost is not on record).",
        labels=["run"],
    )
    upper = GaugeMetricFamily(
        P + "ettr_upper_bound",
        "1 when the run's ETTR is an upper bound (work lost since the checkpoint not on record for some interruption).",
        labels=["run"],
    )
    lost = GaugeMetricFamily(
        P + "lost_seconds", "Wall seconds lost, by kind (rework, detection, restart, queue).", labels=["run", "kind"]
    )
    restarts = CounterMetricFamily(
        P + "restarts",
        "Interruptions followed by a new attempt, by cause (Llama 3 Table 5 category where it maps).",
        labels=["run", "cause"],
    )
    count = CounterMetricFamily(
        P + "interruptions", "Interruptions (fault, rollback, requeue) of the run.", labels=["run"]
    )
    for run, g in accounts:
        if g.ettr is not None:
            ettr.add_metric([run.name], g.ettr)
        upper.add_metric([run.name], 1.0 if g.unknown_lost_work else 0.0)
        for kind in KINDS:
            lost.add_metric([run.name, kind], getattr(g.lost, f"{kind}_s"))
        causes: dict[str, int] = {}
        for i in g.interruptions:
            if i.restart_s is not None:
                causes[i.cause.category] = causes.get(i.cause.category, 0) + 1
        for cause, n in sorted(causes.items()):
            restarts.add_metric([run.name, cause], n)
        count.add_metric([run.name], len(g.interruptions))
    yield from (ettr, upper, lost, restarts, count)


def _event_counts(per_run: Sequence[RunFigures]) -> Metric:
    fam = CounterMetricFamily(
        P + "events", "Logbook events by kind (gave_up, mass_fault, rollback, ...).", labels=["run", "kind"]
    )
    for f in per_run:
        for kind, n in sorted((dict.fromkeys(ZERO_KINDS, 0) | f.events).items()):
            fam.add_metric([f.run.name, kind], n)
    return fam


def _checkpoint_age(per_run: Sequence[RunFigures], now: float) -> Iterator[Metric]:
    age = GaugeMetricFamily(
        P + "verified_checkpoint_age_seconds",
        "Seconds since the newest verified checkpoint "
        "was first verified (active runs with one; absent before the first).",
        labels=["run"],
    )
    running = GaugeMetricFamily(
        P + "run_running_seconds",
        "Seconds since the active run's first attempt started "
        "(for alerts on runs that never had a verified checkpoint).",
        labels=["run"],
    )
    for f in per_run:
        if f.run.state.terminal:
            continue
        if f.first_start is not None:
            running.add_metric([f.run.name], max(0.0, now - f.first_start))
        if f.newest_verified is not None:
            age.add_metric([f.run.name], max(0.0, now - f.newest_verified))
    yield from (age, running)


def _newest_verified(events: Sequence[Event]) -> float | None:
    """When the newest verified checkpoint (highest step; latest when steps are unknown) was first verified."""
    first_seen: dict[str, tuple[float, float]] = {}  # location -> (step or -1, first verification time)
    for e in events:
        if e.kind.value != VERIFIED:
            continue
        where = str(e.evidence.get("location") or e.key)
        step = e.evidence.get("step")
        rank = float(step) if isinstance(step, int | float) else -1.0
        seen = first_seen.get(where)
        first_seen[where] = (rank, min(e.at, seen[1]) if seen else e.at)
    if not first_seen:
        return None
    return max(first_seen.values())[1]


def _histogram(name: str, doc: str, values: Sequence[float], buckets: Sequence[float]) -> Metric:
    counts = [(str(b), float(sum(1 for v in values if v <= b))) for b in buckets]
    counts.append(("+Inf", float(len(values))))
    return HistogramMetricFamily(P + name, doc, buckets=counts, sum_value=float(sum(values)))
