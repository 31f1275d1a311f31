"""A real Prometheus (Debian's 2.42) scrapes the daemon's /metrics route with the read token, as
docs/observability.md's scrape config does, and loads deploy/prometheus/alerts.yml; the series,
the rules' state, the alerts and every Grafana query are read back through its HTTP API.

The daemon's HTTP side is wired as the daemon wires it (supervisor/cli/wiring.py): the real
HttpServer, ``mount_pages`` behind the read token, the pages rendered by ``ProcessRenderer`` (a
child process with its own connection to the SQLite store). The store is written by the test.
"""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.web.pages import PageSettings, mount_pages
from supervisor.adapters.web.renderer import ProcessRenderer
from supervisor.adapters.web.server import HttpServer
from supervisor.domain.records import Event, EventKind
from supervisor.domain.run import RunState
from supervisor.testing.kit.specs import spec
from supervisor.testing.servers.prometheus import LocalPrometheus, PrometheusError, ScrapeTarget, free_port

pytestmark = pytest.mark.prometheus
ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
DASHBOARDS = sorted((ROOT / "deploy/grafana").glob("*.json"))
READ_TOKEN = "read-token-0123456789abcdef0123456789"
JOB = "slurm-supervisor"  # the job name the alert rules expect (docs/observability.md's scrape config)


@dataclass
class Scraped:
    prometheus: LocalPrometheus
    store: SqliteStore
    server: HttpServer
    dead: str  # a second daemon's address in the same job, where nothing listens


def _event(run: str, kind: EventKind, at: float, attempt: int, **evidence: Any) -> Event:
    return Event(run, kind, kind.value, f"{kind.value}:{attempt}:{at}", at, attempt, 500 + attempt, evidence=evidence)


def _fill(store: SqliteStore, now: float) -> None:
    """llm: hung at attempt 0, restarted, running with a verified checkpoint; gone: gave up;
    spiky: running, no event yet (test_a_runs_first_event_shows_in_increase adds one)."""
    store.add_run(spec(script="t.sbatch", partition="gpu"), now - 4000)
    store.add_attempt("llm", 500, 0, now - 4000)
    store.attempt_started("llm", 0, ("n1", "n2"), now - 3900)
    store.record_event(_event("llm", EventKind.FAULT, now - 2000, 0, silent_s=400.0, step_interval_s=10.0))
    store.attempt_ended("llm", 0, now - 1990, "CANCELLED", "CANCELLED", None)
    store.record_event(_event("llm", EventKind.RESTARTED, now - 1980, 1, exclude=[]))
    store.add_attempt("llm", 501, 0, now - 1980)
    store.attempt_started("llm", 1, ("n1", "n3"), now - 1900)
    store.record_event(_event("llm", EventKind.STARTED, now - 1900, 1))
    store.record_event(_event("llm", EventKind.CHECKPOINT_VERIFIED, now - 1000, 1, location="s3://b/1/", step=1000))
    store.set_state("llm", RunState.RUNNING, now - 1900)
    store.add_run(spec(name="gone", script="t.sbatch", partition="gpu", nodes=1), now - 900)
    store.add_attempt("gone", 600, 0, now - 900)
    store.attempt_started("gone", 0, ("n4",), now - 800)
    store.attempt_ended("gone", 0, now - 100, "FAILED", "FAILED", 2)
    store.record_event(_event("gone", EventKind.GAVE_UP, now - 90, 0))
    store.set_state("gone", RunState.RUNNING, now - 800)
    store.set_state("gone", RunState.FAILED, now - 90)
    store.add_run(spec(name="spiky", script="t.sbatch", partition="gpu", nodes=1), now - 600)
    store.add_attempt("spiky", 700, 0, now - 600)
    store.attempt_started("spiky", 0, ("n5",), now - 500)
    store.set_state("spiky", RunState.RUNNING, now - 500)


def _secret(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def scraped(
    start_prometheus: Callable[[LocalPrometheus], LocalPrometheus], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scraped]:
    work = tmp_path_factory.mktemp("prometheus")
    state = work / "state"
    state.mkdir()
    store = SqliteStore(state)
    _fill(store, time.time())
    server = HttpServer(port=0)
    mount_pages(server, ProcessRenderer(state), READ_TOKEN, PageSettings(ttl_s=0.5))
    server.start()
    dead = f"127.0.0.1:{free_port()}"
    targets = [
        ScrapeTarget(JOB, (f"127.0.0.1:{server.port}", dead), _secret(work / "read.token", READ_TOKEN)),
        ScrapeTarget("wrong-token", (f"127.0.0.1:{server.port}",), _secret(work / "other.token", "not-the-token")),
    ]
    prometheus = LocalPrometheus(work / "prometheus", targets, [ALERTS])
    try:
        start_prometheus(prometheus)
        prometheus.wait_for(f'up{{job="{JOB}",instance="127.0.0.1:{server.port}"}} == 1')
        yield Scraped(prometheus, store, server, dead)
    finally:
        prometheus.stop()
        server.stop()
        store.close()


def _read_metrics(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {READ_TOKEN}"})
    answer = conn.getresponse()
    body = answer.read().decode()
    conn.close()
    assert answer.status == 200, body
    return body


def _series(result: list[dict[str, Any]]) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    drop = {"__name__", "job", "instance"}
    return {
        (r["metric"]["__name__"], frozenset((k, v) for k, v in r["metric"].items() if k not in drop)) for r in result
    }


def _value(prometheus: LocalPrometheus, expr: str) -> float:
    result = prometheus.query(expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def test_prometheus_scrapes_every_series_the_route_serves(scraped: Scraped) -> None:
    served = {
        (s.name, frozenset(s.labels.items()))
        for fam in text_string_to_metric_families(_read_metrics(scraped.server.port))
        for s in fam.samples
    }
    stored = _series(scraped.prometheus.query(f'{{__name__=~"slurm_supervisor_.+", job="{JOB}"}}'))
    assert stored == served
    p = scraped.prometheus
    assert _value(p, 'slurm_supervisor_runs{state="running"}') == 2
    assert _value(p, 'slurm_supervisor_events_total{run="gone", kind="gave_up"}') == 1
    assert _value(p, 'slurm_supervisor_interruptions_total{run="llm"}') == 1
    assert _value(p, "slurm_supervisor_recovery_latency_seconds_count") == 1
    assert 1000 <= _value(p, 'slurm_supervisor_verified_checkpoint_age_seconds{run="llm"}') < 1000 + 120


def test_a_scrape_without_the_read_token_is_refused(scraped: Scraped) -> None:
    def wrong_target() -> list[dict[str, Any]]:
        return [t for t in scraped.prometheus.targets() if t["labels"]["job"] == "wrong-token"]

    deadline = time.monotonic() + 20
    wrong = wrong_target()
    while any(t["health"] == "unknown" for t in wrong) and time.monotonic() < deadline:
        time.sleep(0.2)  # the fixture waited for the good scrape; this target's first may come later
        wrong = wrong_target()
    assert len(wrong) == 1 and wrong[0]["health"] == "down", wrong
    assert "403" in wrong[0]["lastError"], wrong[0]["lastError"]


def test_prometheus_loads_every_alert_rule(scraped: Scraped) -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    expected = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    loaded = [r for g in scraped.prometheus.rules() for r in g["rules"]]
    assert {r["name"] for r in loaded} == expected
    deadline = time.monotonic() + 10
    while any(r.get("lastEvaluation", "").startswith("0001") for r in loaded) and time.monotonic() < deadline:
        time.sleep(0.2)  # until every rule has been evaluated (Go's zero time: never)
        loaded = [r for g in scraped.prometheus.rules() for r in g["rules"]]
    assert [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"] == []


def _alerts(scraped: Scraped, name: str) -> list[dict[str, Any]]:
    return [a for a in scraped.prometheus.alerts() if a["labels"]["alertname"] == name]


def _wait_alert(scraped: Scraped, name: str, state: str, timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while not (found := [a for a in _alerts(scraped, name) if a["state"] == state]):
        assert time.monotonic() < deadline, (name, state, scraped.prometheus.alerts())
        time.sleep(0.2)
    return found


def test_the_gave_up_alert_fires_and_a_down_daemon_is_pending(scraped: Scraped) -> None:
    gave_up = _wait_alert(scraped, "SlurmSupervisorRunGaveUp", "firing")
    assert [a["labels"]["run"] for a in gave_up] == ["gone"]
    down = _wait_alert(scraped, "SlurmSupervisorDown", "pending")  # `for: 5m`: pending is as far as a test goes
    assert [a["labels"]["instance"] for a in down] == [scraped.dead]
    assert _alerts(scraped, "SlurmSupervisorMassFault") == []
    assert _alerts(scraped, "SlurmSupervisorRestartLoop") == []


def test_a_runs_first_event_shows_in_increase(scraped: Scraped) -> None:
    p = scraped.prometheus
    watched = 'slurm_supervisor_events_total{run="spiky", kind="rollback"}'
    p.wait_for(watched + " == 0")  # exported from 0 before the run's first rollback ...
    scraped.store.record_event(_event("spiky", EventKind.ROLLBACK, time.time(), 0, to_step=100))
    p.wait_for(f"increase({watched}[1m]) > 0")  # ... so increase() counts it


def _grafana(expr: str) -> str:
    """A dashboard query as Grafana sends it: its variables filled in."""
    return expr.replace("$__rate_interval", "1m").replace("$__range", "1m").replace("$run", ".*")


def _panel_queries(path: Path) -> list[str]:
    board = json.loads(path.read_text())
    panels = board.get("panels", [])
    panels += [p for row in panels for p in row.get("panels", [])]
    return [t["expr"] for p in panels for t in p.get("targets", []) if t.get("expr")]


@pytest.mark.parametrize("dashboard", DASHBOARDS, ids=lambda p: p.name)
def test_every_dashboard_query_runs_and_finds_series(scraped: Scraped, dashboard: Path) -> None:
    p = scraped.prometheus
    p.wait_for('count(count_over_time(up{job="slurm-supervisor"}[1m]) >= 3)')  # increase() and rate() need samples
    empty = []
    for expr in _panel_queries(dashboard):
        if not p.query(_grafana(expr)):  # a query Prometheus cannot parse raises PrometheusError
            empty.append(expr)
    assert empty == []
    for variable in json.loads(dashboard.read_text()).get("templating", {}).get("list", []):
        found = re.fullmatch(r"label_values\((\w+), *(\w+)\)", str(variable.get("query", "")))
        if variable.get("type") == "query" and found:
            assert p.api(f"label/{found[2]}/values", **{"match[]": found[1]}), variable


def test_a_query_prometheus_cannot_parse_is_an_error(scraped: Scraped) -> None:
    with pytest.raises(PrometheusError, match="bad_data"):
        scraped.prometheus.query("sum(slurm_supervisor_runs")
