"""deploy/prometheus/alerts.yml under Prometheus' own tool: it loads (``promtool check rules``) and
the key alerts fire on alerts_test.yml's series, and only there (``promtool test rules``): a run
that gave up, a mass fault, no verified checkpoint for 4 h, a run restarting in a loop, the daemon
down or not scraped, repeated rollbacks, ETTR below target, slow recoveries."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from supervisor.testing.servers.prometheus import promtool

pytestmark = pytest.mark.prometheus
FIXTURE = Path(__file__).with_name("alerts_test.yml")
ALERTS = Path(__file__).resolve().parents[2] / "deploy/prometheus/alerts.yml"


def _alert_names() -> set[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}


def test_the_rules_load(prometheus_installed: None) -> None:
    done = promtool("check", "rules", str(ALERTS))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_alert_names())} rules found" in done.stdout


def test_the_alerts_fire_on_the_fixture_and_only_there(prometheus_installed: None) -> None:
    done = promtool("test", "rules", FIXTURE.name, cwd=FIXTURE.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_case_where_it_fires() -> None:
    fixture = yaml.safe_load(FIXTURE.read_text())
    firing = {
        case["alertname"] for test in fixture["tests"] for case in test["alert_rule_test"] if case.get("exp_alerts")
    }
    assert firing == _alert_names()
    key = {
        "SlurmSupervisorRunGaveUp",
        "SlurmSupervisorMassFault",
        "SlurmSupervisorNoVerifiedCheckpoint",
        "SlurmSupervisorRestartLoop",
        "SlurmSupervisorDown",
    }
    assert key <= firing
