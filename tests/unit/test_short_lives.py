"""What happened between two polls is still on record (issue 21, item 13): an attempt that started
and ended between two polls gets its start from Slurm's start time, and a controller outage longer
than a poll is one logbook entry with its start and end."""

from __future__ import annotations

from unit.sim_world import SimWorld

from supervisor.domain.records import EventKind
from supervisor.domain.run import SparePolicy
from supervisor.engine.reconcile import EngineSettings
from supervisor.testing.kit.specs import spec

SPEC = spec(spare_policy=SparePolicy.PARTITION_IDLE)


def test_an_attempt_shorter_than_a_poll_has_its_start_on_record(tmp_path):
    w = SimWorld(tmp_path, SPEC, nodes=3, settings=EngineSettings(evidence_wait_s=0.0), interval=10.0)
    w.engine.tick()  # submitted; Slurm starts it at once and it dies 2 s later, before the next poll
    job = w.run().attempt.job_id
    started = w.cluster.inspect().jobs[job].start_time
    w.clock.call_at(started + 2.0, lambda: w.cluster.finish_job(job, exit_code=1))
    w.clock.wait(10.0)
    w.ticks(3)
    first = w.store.attempts("llm")[0]
    assert first.started_at == started and first.ended_at is not None
    [start] = [e for e in w.events(EventKind.STARTED) if e.attempt == 0]
    assert start.at == started and "between two polls" in start.message


def test_a_controller_outage_is_one_logbook_entry_with_its_start_and_end(tmp_path):
    w = SimWorld(tmp_path, SPEC, nodes=3, settings=EngineSettings(outage_logged_after_s=10.0))
    w.until(w.running)
    w.cluster.controller_down(True)
    down_at = w.clock.now()
    w.ticks(60)
    assert not w.events(EventKind.CONTROLLER_OUTAGE)  # written once it is over: start and end
    w.cluster.controller_down(False)
    w.ticks(5)
    [outage] = w.events(EventKind.CONTROLLER_OUTAGE)
    assert outage.evidence["since"] - down_at <= 1.0 and outage.evidence["until"] - outage.evidence["since"] >= 59.0
    w.cluster.controller_down(True)
    w.ticks(3)  # a blip shorter than the threshold leaves no entry
    w.cluster.controller_down(False)
    w.ticks(2)
    assert len(w.events(EventKind.CONTROLLER_OUTAGE)) == 1
