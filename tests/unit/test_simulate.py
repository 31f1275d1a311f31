"""The simulator at work: the real engine on a simulated cluster, against plain Slurm, on virtual time."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from click.testing import CliRunner

from supervisor.cli import main
from supervisor.domain.checkpoints.manifest import Level, Outcome
from supervisor.domain.health.findings import Severity
from supervisor.domain.progress import parser_for
from supervisor.domain.records import EventKind
from supervisor.sim.clock import VirtualClock
from supervisor.sim.faults.failures import TABLE5, Failure
from supervisor.sim.faults.health import SimHealthFeed
from supervisor.sim.runner import Simulation
from supervisor.sim.training.checkpoints import SimCheckpointStore
from supervisor.sim.training.settings import Mode, SimSettings
from supervisor.sim.training.trainer import SimTrainer, TrainerSettings

CATS = {c.component: c for c in TABLE5}
SMALL = SimSettings(gpus=32, gpus_per_node=8, spares=2, days=1.0, seed=5)


def draw(*faults: tuple[float, str], seed: int = 1) -> list[Failure]:
    rng = random.Random(seed)
    return [Failure(at, CATS[name], rng.random(), rng.random(), rng.random()) for at, name in faults]


def supervise(tmp_path, failures, settings=SMALL, name="sup"):
    return Simulation(settings, Mode.SUPERVISOR, tmp_path / name).run(failures)


def faults_in_logbook(result):
    from supervisor.adapters.sqlite import SqliteStore

    store = SqliteStore(result.state_dir)
    try:
        return [e for e in store.events(result.run) if e.kind is EventKind.FAULT]
    finally:
        store.close()


def test_a_dead_host_is_seen_on_the_daemons_poll_grid_and_recovered_on_a_spare(tmp_path):
    t = 7200.0 + 1.3
    sup = supervise(tmp_path, draw((t, "Power Supply")))
    base = Simulation(SMALL, Mode.BASELINE).run(draw((t, "Power Supply")))
    (fault,) = faults_in_logbook(sup)
    delay = fault.at - (sup.strikes[0].at)
    assert 0 < delay <= SMALL.poll_interval_s + SMALL.probe_confirm_s + 1.0
    assert "probe failed" in fault.message
    startup = SMALL.trainer.startup_s + SMALL.trainer.restore_s
    (recover,) = sup.recover_times()
    assert recover < startup + 10.0
    (slurm_alone,) = base.recover_times()
    assert slurm_alone > SMALL.slurmd_timeout_s  # Slurm alone waits for SlurmdTimeout, then the repair
    assert sup.ettr > base.ettr


def test_a_hang_is_caught_by_the_hang_detector_long_before_nccls_watchdog(tmp_path):
    t = 5 * 3600.0 + 17.0
    sup = supervise(tmp_path, draw((t, "NCCL Watchdog Timeouts")))
    base = Simulation(SMALL, Mode.BASELINE).run(draw((t, "NCCL Watchdog Timeouts")))
    (fault,) = faults_in_logbook(sup)
    assert "hang" in fault.message and "learned step interval" in fault.message
    assert fault.at - sup.strikes[0].at < SMALL.nccl_timeout_s / 1.5
    (recover,) = base.recover_times()
    assert recover >= SMALL.nccl_timeout_s
    assert sup.recover_times()[0] < recover


@pytest.mark.slow  # supervises half a day twice, once tick by tick (~3 s)
def test_skipping_quiet_ticks_changes_nothing_the_engine_records(tmp_path):
    faults = draw(
        (3600.0 + 2.2, "Faulty GPU"),
        (4 * 3600.0 + 9.9, "Host Maintenance"),
        (7 * 3600.0 + 3.1, "NCCL Watchdog Timeouts"),
        (9 * 3600.0 + 0.4, "Software Bug"),
    )
    settings = replace(SMALL, days=0.5)
    fast = supervise(tmp_path, faults, settings, "fast")
    slow = supervise(tmp_path, faults, replace(settings, skip_quiet_ticks=False), "slow")
    assert slow.ticks > 5 * fast.ticks
    assert [(e.message, round(e.at, 3)) for e in faults_in_logbook(fast)] == [
        (e.message, round(e.at, 3)) for e in faults_in_logbook(slow)
    ]
    assert fast.recover_times() == slow.recover_times()
    assert fast.kept_steps == slow.kept_steps


def test_both_modes_see_the_same_failure_draw(tmp_path):
    settings = replace(SMALL, gpus=2048, days=3.0, seed=9)
    failures = settings.failures.draw(9, settings.gpus, settings.seconds)
    assert len(failures) == 4  # 2,048 GPUs for 3 days: 2.9 expected; this seed draws 4
    a = supervise(tmp_path, None, settings)  # the simulation draws by itself from the seed
    b = Simulation(settings, Mode.BASELINE).run(failures)
    assert [(s.at, s.cause) for s in a.strikes] == [(s.at, s.cause) for s in b.strikes]
    assert len(a.strikes) == len(failures)


def test_without_failures_ettr_is_the_checkpoint_and_startup_overhead(tmp_path):
    sup = supervise(tmp_path, [])
    t = SMALL.trainer
    expected = 1 - (t.startup_s + SMALL.seconds * t.save_s / (t.checkpoint_steps * t.step_s)) / SMALL.seconds
    assert sup.interruptions == 0 and sup.attempts == 1
    assert abs(sup.ettr - expected) < 0.02  # the rest is step-time noise


# -- the trainer and its checkpoints ---------------------------------------------------------------


def trainer(resume_uncommitted=False):
    clock = VirtualClock()
    store = SimCheckpointStore(clock)
    settings = TrainerSettings(
        step_s=1.0, log_every=10, checkpoint_steps=100, save_s=20.0, restore_s=5.0, startup_s=5.0, step_noise=0.0
    )
    return clock, store, SimTrainer(settings, clock, store, resume_uncommitted=resume_uncommitted)


def test_trainer_writes_megatron_lines_the_real_parser_reads():
    clock, _, tr = trainer()
    tr.start((1, 0), "/logs/a.out", ("n001",), {})
    clock.advance(5.0 + 100.0)
    source = tr.opener("/logs/a.out", False)
    records = parser_for(None).feed_all(source.read_lines())
    assert [r.step for r in records] == list(range(10, 101, 10))
    assert {r.source_format for r in records} == {"megatron"} and all(r.loss for r in records)
    assert source.read_lines() == []  # nothing new until time passes


def test_a_save_torn_by_a_failure_is_corrupt_and_only_the_baseline_resumes_from_it():
    clock, store, tr = trainer()
    a = tr.start((1, 0), "/logs/a.out", ("n001",), {})
    clock.advance(5.0 + 200.0 + 20.0 + 5.0)  # past the first save (step 100, committed), into the second
    tr.end(a, clock.now())
    refs = {r.step: r for r in store.discover()}
    assert refs[100].committed and not refs[200].committed
    assert store.verify(refs[100], Level.FULL).outcome is Outcome.VERIFIED
    torn = store.verify(refs[200], Level.METADATA)
    assert torn.outcome is Outcome.CORRUPT and torn.problems[0].problem == "uncommitted"
    assert tr.start((2, 0), "/logs/b.out", ("n001",), {}).resume_step == 100
    tr.resume_uncommitted = True  # the baseline: the newest save, whatever its state
    b = tr.start((3, 0), "/logs/c.out", ("n001",), {})
    assert b.resume_step == 200 and b.resume_torn
    tr.end(b, b.computing_at)  # its load fails ...
    assert tr.start((4, 0), "/logs/d.out", ("n001",), {}).resume_step == 100  # ... and the next falls back


def test_the_supervisors_resume_step_wins_over_the_trainers_own_choice():
    clock, store, tr = trainer()
    a = tr.start((1, 0), "/logs/a.out", ("n001",), {})
    clock.advance(5.0 + 400.0 + 4 * 20.0)
    tr.end(a, clock.now())
    assert store.newest(committed_only=True).step > 100
    assert tr.start((2, 0), "/logs/b.out", ("n001",), {"SSV_RESUME_STEP": "100"}).resume_step == 100


def test_saves_generated_ahead_of_the_clock_are_not_visible_yet():
    clock, store, tr = trainer()
    a = tr.start((1, 0), "/logs/a.out", ("n001",), {})
    tr.last_line_before(a, clock.now() + 1000.0)  # the simulator peeks ahead
    assert store.discover() == []
    clock.advance(130.0)
    assert [r.step for r in store.discover()] == [100]


def test_health_feed_reports_a_gpu_fault_within_one_agent_sample():
    clock = VirtualClock()
    feed = SimHealthFeed(clock, ["n001", "n002"], sample_s=10.0)
    assert feed.fault("n001", CATS["Faulty GPU"], clock.now(), phase=0.4) == clock.now() + 4.0
    feed.fault("n002", CATS["Power Supply"], clock.now(), phase=0.1)
    assert feed.fault("n001", CATS["Software Bug"], clock.now(), phase=0.5) is None
    assert feed.drain_findings() == []
    clock.advance(5.0)
    (finding,) = feed.drain_findings()
    assert finding.node == "n001" and finding.severity is Severity.FATAL and "XID 79" in finding.reason
    ages = feed.heartbeat_ages(clock.now() + 60.0)
    assert ages["n002"] == pytest.approx(65.0) and ages["n001"] <= 10.0


# -- the command ---------------------------------------------------------------------------------


def test_simulate_command_compares_and_leaves_a_logbook(tmp_path):
    runner = CliRunner()
    state = tmp_path / "state"
    result = runner.invoke(
        main,
        [
            "simulate",
            "--gpus",
            "64",
            "--days",
            "2",
            "--compare",
            "--seed",
            "3",
            "--state-dir",
            str(state),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    for text in ("ETTR", "supervisor", "baseline", "time to recover p50", "assumed:", "Young/Daly"):
        assert text in result.output
    logbook = runner.invoke(main, ["--state-dir", str(state), "logbook", "llama3-405b"])
    assert logbook.exit_code == 0 and "registered" in logbook.output
    as_json = runner.invoke(main, ["simulate", "--gpus", "64", "--days", "1", "--baseline", "--json"])
    figures = json.loads(as_json.output)["figures"]
    assert list(figures) == ["baseline"] and 0.0 < figures["baseline"]["ettr"] <= 1.0


def test_simulate_rejects_bad_input_with_the_fix():
    result = CliRunner().invoke(main, ["simulate", "--checkpoint-interval", "often", "--days", "1"])
    assert result.exit_code == 2 and "neither seconds nor 'auto'" in result.output
    result = CliRunner().invoke(main, ["simulate", "--gpus", "12", "--days", "1"])
    assert result.exit_code == 2 and "multiple of gpus_per_node" in result.output


def test_demo_shows_four_causes_and_prints_the_logbook(tmp_path):
    result = CliRunner().invoke(main, ["simulate", "--demo", "--state-dir", str(tmp_path), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "LOGBOOK" in result.output and "hang: no new step" in result.output
    assert "probe failed" in result.output and result.output.count("restarted as job") >= 4
    causes = result.output.split("interruptions by cause (mean per run):\n", 1)[1].split("\n\n", 1)[0]
    names = [line.rsplit(None, 1)[0].strip() for line in causes.splitlines()]
    assert len(names) == 4 and names == sorted(names)  # one each: ties by name, the same output every run


def test_with_node_agents_a_gpu_fault_is_pinned_on_its_node_and_the_node_kept_out(tmp_path):
    settings = replace(SMALL, node_agents=True)
    sup = supervise(tmp_path, draw((3 * 3600.0 + 0.7, "Faulty GPU")), settings)
    faults = faults_in_logbook(sup)
    assert any("XID 79" in e.message for e in faults)
    node = sup.strikes[0].node
    assert sup.crash_restarts <= 1  # at most the one restart that beat the agent's next sample
    without = supervise(tmp_path, draw((3 * 3600.0 + 0.7, "Faulty GPU")), replace(SMALL, node_agents=False), "plain")
    assert not any(node in e.message for e in faults_in_logbook(without))  # no agent: nobody names it


def test_compare_is_fair_by_default_the_baseline_has_the_supervisors_spares_as_idle_nodes():
    # Issue 16: the supervisor had 64 named spares while Slurm alone had no idle node.
    args = ["simulate", "--gpus", "32", "--days", "0.5", "--spares", "3", "--compare", "--json"]
    doc = json.loads(CliRunner().invoke(main, args).output)
    assert "supervisor: 3 named spares; baseline: 3 idle nodes" in doc["assumptions"]["nodes"]
    sup, base = doc["figures"]["supervisor"], doc["figures"]["baseline"]
    assert sup["spare_node_hours"] == base["spare_node_hours"] == pytest.approx(3 * 12.0)
    alone = json.loads(CliRunner().invoke(main, [*args, "--baseline-spares", "0"]).output)
    assert "baseline: 0 idle nodes" in alone["assumptions"]["nodes"]
    assert alone["figures"]["baseline"]["spare_node_hours"] == 0.0
    bad = CliRunner().invoke(main, [*args, "--baseline-spares", "many"])
    assert bad.exit_code == 2 and "neither a number nor 'same'" in bad.output


def test_a_fair_baseline_restarts_on_an_idle_node_while_slurm_alone_waits_for_the_repair():
    faults = draw((3 * 3600.0 + 0.7, "Faulty GPU"))  # a 4-hour replacement
    alone = Simulation(SMALL, Mode.BASELINE).run(faults)
    fair = Simulation(replace(SMALL, baseline_spares=SMALL.spares), Mode.BASELINE).run(faults)
    (waited,) = alone.recover_times()
    (moved,) = fair.recover_times()
    assert moved < SMALL.health_check_s + 600.0 < waited  # NHC drains the node; the requeue takes an idle one
    assert fair.ettr > alone.ettr
