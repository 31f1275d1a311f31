"""Issue 31: a planned end is a continuation. A job that ends on purpose after a verified save — at
its time limit, by the continue exit code, or Megatron's exit 0 below the target step — is continued:
no restart spent, no interruption in goodput (a continuation line of its own), no page. A limit
reached without a save is one fault whose line says how to make it a continuation; a chain that
keeps "continuing" without a newer checkpoint is blocked with one page.

The engine on the simulated cluster and virtual time; the trainer is a log the test writes and
checkpoints saved into storage held in memory (tests/memory_checkpoints.py)."""

from __future__ import annotations

from dataclasses import replace

from memory_checkpoints import ROOT
from unit.sim_world import SimWorld

from supervisor.domain.goodput.account import goodput
from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.records import EventKind
from supervisor.domain.run import CheckpointPolicy, RunSpec, RunState
from supervisor.testing.kit.specs import spec

POLICY = CheckpointPolicy(root=ROOT, scan_interval_s=10.0, full_verify=False)
SPEC = spec(script="/w/train.sbatch", workdir="/w", output="/logs/%x-%j.out", max_restarts=5, checkpoints=POLICY)
PATIENT = HangSettings(floor_s=3000, cap_s=3600, startup_grace_s=3600)


def world(tmp_path, spec: RunSpec = SPEC) -> SimWorld:
    return SimWorld(tmp_path, spec, watch_checkpoints=True, hang=PATIENT)


def megatron(step: int) -> str:
    return (
        f" iteration {step:8d}/ 1000000 | consumed samples: {step * 64} | elapsed time per iteration (ms): "
        f"1000.0 | learning rate: 1.0E-04 | global batch size: 64 | lm loss: 2.5 | loss scale: 1.0 | "
        f"grad norm: 1.0 | number of skipped iterations: 0 | number of nan iterations: 0 |"
    )


def train(w: SimWorld, first: int, last: int) -> None:
    """The current attempt runs and its log shows steps ``first``..``last``, read by the engine."""
    w.until(w.running)
    path = f"/logs/llm-{w.run().attempt.job_id}.out"
    w.until(lambda: path in w.logs)
    for step in range(first, last + 1):
        w.logs[path].append(megatron(step))
    w.until(lambda: w.run().attempt.last_step == last, limit=20)


def kinds(w: SimWorld) -> list[str]:
    return [e.kind.value for e in w.events()]


def ends_at_its_limit(w: SimWorld) -> int:
    job_id = w.run().attempt.job_id
    w.cluster.time_out(job_id)
    return job_id


def test_a_job_at_its_time_limit_after_a_verified_save_is_continued(tmp_path):
    w = world(tmp_path)
    train(w, 1, 200)
    w.ckpt.save(200)  # the trainer saved at the signal, before the limit
    ends_at_its_limit(w)
    w.clock.wait(5.0)  # the daemon's next poll
    w.until(lambda: w.running(seq=1))
    run = w.run()
    assert run.restarts_spent == 0  # today: one restart spent per day of a week-long run
    assert "fault" not in kinds(w) and "restarted" not in kinds(w)
    assert kinds(w).count("continued") == 1
    assert w.submitted_env()["SSV_RESUME_STEP"] == "200"
    report = goodput("llm", w.store.attempts("llm"), w.store.events("llm"), now=w.clock.now())
    assert report.interruptions == ()  # not an interruption ...
    gap = report.by_cause["continuation"]  # ... but a line of its own: the gap and the start-up
    assert gap.restart_s == 5.0 and report.lost.rework_s == 0.0


def test_the_continue_exit_code_after_a_verified_save_is_continued(tmp_path):
    w = world(tmp_path)
    train(w, 1, 120)
    w.ckpt.save(120)
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=75)  # "saved, continue me"
    w.until(lambda: w.running(seq=1))
    assert w.run().restarts_spent == 0 and "fault" not in kinds(w)
    assert kinds(w).count("continued") == 1


def test_megatron_exit_zero_below_the_target_step_is_continued_not_completed(tmp_path):
    from supervisor.domain.run import ContinuationPolicy

    w = world(tmp_path, replace(SPEC, continuation=ContinuationPolicy(target_step=1000)))
    train(w, 1, 300)
    w.ckpt.save(300)  # --exit-duration-in-mins: Megatron saves, then exits 0
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=0)
    w.until(lambda: w.running(seq=1))
    assert w.run().state is RunState.RUNNING and "completed" not in kinds(w)
    assert w.run().restarts_spent == 0


def test_a_limit_reached_without_a_save_is_one_fault_that_says_how_to_continue(tmp_path):
    w = world(tmp_path)
    train(w, 1, 300)
    w.ckpt.save(200)  # 100 steps since the newest checkpoint: the trainer did not save at the end
    ends_at_its_limit(w)
    w.until(lambda: w.running(seq=1))
    assert w.run().restarts_spent == 1
    faults = w.events(EventKind.FAULT)
    assert len(faults) == 1 and "continued" not in kinds(w)
    assert "[continuation]" in faults[0].message and "signal" in faults[0].message
    report = goodput("llm", w.store.attempts("llm"), w.store.events("llm"), now=w.clock.now())
    assert len(report.interruptions) == 1 and report.interruptions[0].lost_steps == 100


def test_a_chain_that_never_saves_anew_is_blocked_after_n_continuations_with_one_page(tmp_path):
    from supervisor.domain.run import ContinuationPolicy

    w = world(tmp_path, replace(SPEC, continuation=ContinuationPolicy(max_without_progress=2)))
    w.until(w.running)
    w.ckpt.save(100)
    for seq in range(4):  # the limit is shorter than the start-up: no step is ever logged
        if w.run().state.terminal:
            break
        w.until(lambda s=seq: w.running(seq=s))
        ends_at_its_limit(w)
        w.until(lambda s=seq: w.run().state.terminal or w.running(seq=s + 1))
    run = w.run()
    assert run.state is RunState.FAILED and run.restarts_spent == 0
    gave_up = w.events(EventKind.GAVE_UP)
    assert len(gave_up) == 1 and "blocked" in gave_up[0].message and "newer" in gave_up[0].message
    assert kinds(w).count("continued") == 2


def test_the_bound_survives_a_daemon_restart(tmp_path):
    from supervisor.domain.run import ContinuationPolicy

    w = world(tmp_path, replace(SPEC, continuation=ContinuationPolicy(max_without_progress=2)))
    w.until(w.running)
    w.ckpt.save(100)
    ends_at_its_limit(w)
    w.until(lambda: w.running(seq=1))
    ends_at_its_limit(w)
    w.until(lambda: w.running(seq=2))
    w.new_engine()  # the tally lives in the store, not in the daemon
    ends_at_its_limit(w)
    w.until(lambda: w.run().state.terminal)
    assert w.run().state is RunState.FAILED and len(w.events(EventKind.GAVE_UP)) == 1


def test_megatron_exit_16_restarts_once_with_the_attempts_nodes_kept_out(tmp_path):
    w = world(tmp_path, replace(SPEC, checkpoints=None))
    w.until(w.running)
    nodes = set(w.run().attempt.nodes)
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=16)  # run again elsewhere to tell
    w.until(lambda: w.running(seq=1))
    run = w.run()
    assert run.restarts_spent == 1 and nodes <= set(run.excluded)
    assert not set(run.attempt.nodes) & nodes


def test_megatron_exit_17_fails_and_pages_without_a_restart(tmp_path):
    w = world(tmp_path, replace(SPEC, checkpoints=None))
    w.until(w.running)
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=17)  # failed result validation
    w.until(lambda: w.run().state.terminal)
    assert w.run().state is RunState.FAILED and w.run().restarts_spent == 0
    assert len(w.events(EventKind.GAVE_UP)) == 1 and "17" in w.events(EventKind.GAVE_UP)[0].message


def test_a_specs_own_exit_code_map_is_honoured(tmp_path):
    from supervisor.domain.run import ExitMeaning

    spec = replace(SPEC, checkpoints=None, exit_codes={42: ExitMeaning.STOP, 17: ExitMeaning.RESTART})
    w = world(tmp_path, spec)
    w.until(w.running)
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=17)  # this run's trainer: 17 is transient
    w.until(lambda: w.running(seq=1))
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=42)
    w.until(lambda: w.run().state.terminal)
    assert w.run().state is RunState.FAILED and w.run().restarts_spent == 1


def test_continuation_asks_slurm_for_the_signal_and_tells_the_job(tmp_path):
    from supervisor.domain.run import ContinuationPolicy

    w = world(tmp_path, replace(SPEC, continuation=ContinuationPolicy(signal="USR1", lead_s=600, exit_code=75)))
    w.until(w.running)
    request = w.cluster.job_request(w.run().attempt.job_id)
    assert "--signal=B:USR1@600" in request.extra_args
    assert request.env["SSV_CONTINUE_EXIT_CODE"] == "75" and request.env["SSV_CONTINUE_SIGNAL"] == "USR1"
