"""Prometheus metrics over a real store, read back with prometheus_client's own text parser."""

from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from test_goodput import RUN, T0, scenario

from supervisor.adapters.metrics import metrics_page, metrics_text
from supervisor.adapters.sqlite import SqliteStore
from supervisor.domain.records import Event, EventKind, NodeVerdict, Verdict
from supervisor.domain.run import RunState
from supervisor.testing.kit.specs import spec

ROOT = Path(__file__).resolve().parents[2]


def _families(text: bytes) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def _value(families: dict, name: str, sample: str | None = None, **labels: str) -> float:
    fam = families[name]
    found = [
        s.value
        for s in fam.samples
        if (sample is None or s.name == sample) and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, fam.samples)
    return found[0]


@pytest.fixture
def store(tmp_path):
    """Run llama-70b replayed from the goodput scenario (completed), plus a running run with a
    verified checkpoint and a queued run with none."""
    s = SqliteStore(tmp_path)
    attempts, events = scenario()
    s.add_run(spec(name=RUN, script="t.sbatch", partition="gpu", max_restarts=5), T0)
    for a in attempts:
        s.add_attempt(RUN, a.job_id, a.restart_count, a.submitted_at)
        s.attempt_started(RUN, a.seq, a.nodes, a.started_at)
        s.attempt_ended(RUN, a.seq, a.ended_at, a.end_state, a.end_state, None)
    for e in events:
        s.record_event(e)
    for state in (RunState.RUNNING, RunState.COMPLETED):
        s.set_state(RUN, state, T0 + 30000)
    s.add_run(spec(name="gpt-b", script="t.sbatch", partition="gpu", nodes=4), T0)
    s.add_attempt("gpt-b", 900, 0, T0)
    s.attempt_started("gpt-b", 0, ("n1", "n2", "n3", "n4"), T0 + 100)
    s.set_state("gpt-b", RunState.RUNNING, T0 + 100)
    for step, at in ((1000, 2000), (2000, 5000)):
        s.record_event(
            Event(
                "gpt-b",
                EventKind.CHECKPOINT_VERIFIED,
                f"checkpoint step {step} verified",
                f"v{step}",
                T0 + at,
                0,
                900,
                evidence={"location": f"s3://b/ckpt/{step}/", "step": step},
            )
        )
    s.record_event(
        Event(
            "gpt-b",
            EventKind.CHECKPOINT_VERIFIED,
            "checkpoint step 1000 verified (full)",
            "v1000f",
            T0 + 6000,
            0,
            900,
            evidence={"location": "s3://b/ckpt/1000/", "step": 1000},
        )
    )
    s.add_run(spec(name="queued-c", script="t.sbatch", partition="gpu", nodes=1), T0)
    s.set_verdict(NodeVerdict("gpu-2", Verdict.BAD, "XID 79", {}, RUN, None, T0 + 20400))
    s.set_node_action("gpu-2", "drained", T0 + 20400)
    s.set_verdict(NodeVerdict("gpu-9", Verdict.BAD, "probe", {}, RUN, "blast-radius", T0 + 20400))
    yield s
    s.close()


def test_metrics_parse_and_carry_the_store(store):
    status, headers, body = metrics_page(store, T0 + 40000)
    assert status == 200 and dict(headers)["Content-Type"].startswith("text/plain; version=")
    f = _families(body)
    assert _value(f, "slurm_supervisor_runs", state="running") == 1
    assert _value(f, "slurm_supervisor_runs", state="completed") == 1
    assert _value(f, "slurm_supervisor_runs", state="registered") == 1
    assert _value(f, "slurm_supervisor_bad_nodes", action="drained") == 1
    assert _value(f, "slurm_supervisor_bad_nodes", action="excluded") == 1
    assert _value(f, "slurm_supervisor_ettr", run=RUN) == pytest.approx(26940 / 30000)
    assert _value(f, "slurm_supervisor_ettr_upper_bound", run=RUN) == 1
    assert _value(f, "slurm_supervisor_lost_seconds", run=RUN, kind="rework") == 1000
    assert _value(f, "slurm_supervisor_restarts", run=RUN, cause="GPU") == 1
    assert _value(f, "slurm_supervisor_restarts", run=RUN, cause="Hang (no progress)") == 1
    assert _value(f, "slurm_supervisor_events", run=RUN, kind="fault") == 2
    assert _value(f, "slurm_supervisor_interruptions", run=RUN) == 2


def test_latency_histograms(store):
    f = _families(metrics_text(store, T0 + 40000))
    det = "slurm_supervisor_detection_latency_seconds"
    assert _value(f, det, det + "_count") == 1 and _value(f, det, det + "_sum") == 400  # the hang's silence
    assert _value(f, det, det + "_bucket", le="300.0") == 0 and _value(f, det, det + "_bucket", le="600.0") == 1
    rec = "slurm_supervisor_recovery_latency_seconds"
    assert _value(f, rec, rec + "_count") == 2 and _value(f, rec, rec + "_sum") == 400 + 660
    assert _value(f, rec, rec + "_bucket", le="600.0") == 1 and _value(f, rec, rec + "_bucket", le="1800.0") == 2


def test_checkpoint_age_is_the_newest_step_and_absent_without_one(store):
    f = _families(metrics_text(store, T0 + 40000))
    # step 2000 first verified at +5000 (a later full check of step 1000 does not make it newer)
    assert _value(f, "slurm_supervisor_verified_checkpoint_age_seconds", run="gpt-b") == 35000
    assert _value(f, "slurm_supervisor_run_running_seconds", run="gpt-b") == 39900
    ages = {s.labels["run"] for s in f["slurm_supervisor_verified_checkpoint_age_seconds"].samples}
    assert ages == {"gpt-b"}  # the completed run is not watched; the queued one has none


def test_alert_rules_and_dashboard_use_only_metrics_we_export(store):
    exported = set()
    for fam in _families(metrics_text(store, T0 + 40000)).values():
        exported |= {s.name for s in fam.samples} | {fam.name}
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {
        "SlurmSupervisorRunGaveUp",
        "SlurmSupervisorMassFault",
        "SlurmSupervisorNoVerifiedCheckpoint",
        "SlurmSupervisorRepeatedRollbacks",
        "SlurmSupervisorEttrBelowTarget",
    } <= names
    dashboard = (ROOT / "deploy/grafana/slurm-supervisor.json").read_text()
    import json
    import re

    panels = json.loads(dashboard)["panels"]
    exprs += [t["expr"] for p in panels for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"slurm_supervisor_\w+", e)}
    assert used and used <= exported, sorted(used - exported)
