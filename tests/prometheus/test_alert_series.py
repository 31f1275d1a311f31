"""What the alert rules and the dashboard assume of /metrics, checked on the exposition text (no
Prometheus needed): every metric and event kind they name is exported, and the event kinds they
watch are counted from 0 from a run's registration, so that Prometheus' increase() sees a run's
first one (a counter series born at 1 has no earlier sample to increase from)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from supervisor.adapters.metrics import metrics_text
from supervisor.adapters.sqlite import SqliteStore
from supervisor.testing.kit.specs import spec

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
DASHBOARDS = sorted((ROOT / "deploy/grafana").glob("*.json"))
T0 = 1_700_000_000.0
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def rule_exprs() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def dashboard_queries(path: Path) -> list[str]:
    """Every PromQL text in a Grafana dashboard: panel targets and query variables."""
    board = json.loads(path.read_text())
    panels = board.get("panels", [])
    panels += [p for row in panels for p in row.get("panels", [])]  # collapsed rows hold their panels
    exprs = [t["expr"] for p in panels for t in p.get("targets", []) if t.get("expr")]
    variables = board.get("templating", {}).get("list", [])
    exprs += [_query_text(v["query"]) for v in variables if v.get("type") == "query"]
    return exprs


def _query_text(query: Any) -> str:
    return str(query.get("query", "") if isinstance(query, dict) else query)


def watched_kinds(exprs: list[str]) -> set[str]:
    kinds: set[str] = set()
    for selector in re.findall(r'kind=~?"([^"]*)"', " ".join(exprs)):
        kinds |= set(selector.split("|"))
    return kinds


def _exported(text: bytes) -> tuple[set[str], dict[tuple[str, str], float]]:
    names: set[str] = set()
    events: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text.decode()):
        names |= {fam.name + suffix for suffix in SUFFIXES.get(fam.type, ("",))}  # also families with no sample yet
        events |= {(s.labels["run"], s.labels["kind"]): s.value for s in fam.samples if s.name.endswith("events_total")}
    return names, events


@pytest.fixture
def just_registered(tmp_path: Path) -> bytes:
    store = SqliteStore(tmp_path)
    store.add_run(spec(script="t.sbatch", partition="gpu"), T0)
    store.add_attempt("llm", 100, 0, T0)
    store.attempt_started("llm", 0, ("n1", "n2"), T0 + 10)
    text = metrics_text(store, T0 + 60)
    store.close()
    return text


def test_a_new_run_counts_the_watched_event_kinds_from_zero(just_registered: bytes) -> None:
    _, events = _exported(just_registered)
    watched = watched_kinds(rule_exprs() + [q for d in DASHBOARDS for q in dashboard_queries(d)])
    assert {"gave_up", "mass_fault", "rollback", "crash_loop"} <= watched
    assert {kind: events.get(("llm", kind)) for kind in watched} == dict.fromkeys(watched, 0.0)


def test_the_rules_and_dashboards_name_only_exported_metrics(just_registered: bytes) -> None:
    names, _ = _exported(just_registered)
    assert DASHBOARDS, "no Grafana dashboard in deploy/grafana"
    for source, exprs in [(ALERTS.name, rule_exprs())] + [(d.name, dashboard_queries(d)) for d in DASHBOARDS]:
        used = {m for e in exprs for m in re.findall(r"slurm_supervisor_\w+", e)}
        assert used and used <= names, (source, sorted(used - names))
