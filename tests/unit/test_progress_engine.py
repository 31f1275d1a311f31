"""Hang detection wired into the engine: a trainer on the simulated cluster that stops logging."""

from __future__ import annotations

from dataclasses import replace

import pytest
from unit.sim_world import SimWorld

from supervisor.domain.progress.hang import HangSettings
from supervisor.domain.progress.outputs import output_path
from supervisor.domain.records import EventKind
from supervisor.domain.run import RunState
from supervisor.testing.kit.specs import spec

SPEC = spec(script="/w/train.sbatch", workdir="/w", output="/logs/%x-%j.out", max_restarts=3)


@pytest.mark.parametrize(
    "output, expected",
    [
        (None, "/w/slurm-1234.out"),
        ("/logs/%x-%j.out", "/logs/llm-1234.out"),
        ("rel/%8j.log", "/w/rel/00001234.log"),
        ("/logs/100%%-%A.out", "/logs/100%-1234.out"),
        ("/logs/%x-%N.out", None),  # one file per node: nothing single to follow
    ],
)
def test_output_path(output, expected):
    assert output_path(replace(SPEC, output=output), 1234) == expected


def megatron(step):
    return (
        f" iteration {step:8d}/ 1000000 | consumed samples: {step * 64} | elapsed time per iteration (ms): "
        f"1000.0 | learning rate: 1.0E-04 | global batch size: 64 | lm loss: 2.5 | loss scale: 1.0 | "
        f"grad norm: 1.0 | number of skipped iterations: 0 | number of nan iterations: 0 |"
    )


@pytest.mark.parametrize(
    ("multiple", "floor_s", "step_s", "tick_s"),
    [
        (3, 5, 1.0, 1.0),  # the floor dominates
        (2, 1, 10.0, 5.0),  # issue 4's goal: within 2 x the median step time plus one tick
    ],
)
def test_a_trainer_that_stops_logging_is_restarted(tmp_path, multiple, floor_s, step_s, tick_s):
    settings = HangSettings(multiple=multiple, floor_s=floor_s, cap_s=600, startup_grace_s=60)
    w = SimWorld(tmp_path, SPEC, probe=False, hang=settings)
    step = 0
    hung_at = None
    next_line = 0.0
    for _ in range(2000):
        w.engine.tick()  # the trainer acts between the tick and the wait
        run = w.run()
        if run.attempt and run.attempt.seq == 1 and run.state is RunState.RUNNING:
            break
        if run.attempt and run.attempt.started_at and run.attempt.seq == 0:
            path = f"/logs/llm-{run.attempt.job_id}.out"
            if path in w.logs and step < 40 and w.clock.now() >= next_line:
                step += 1
                w.logs[path].append(megatron(step))
                next_line = w.clock.now() + step_s
            elif step >= 40 and hung_at is None:
                hung_at = w.clock.now()
        w.clock.wait(tick_s)
    run = w.run()
    assert run.attempt.seq == 1 and run.state is RunState.RUNNING
    fault = w.events(EventKind.FAULT)[0]
    assert "hang" in fault.message and fault.evidence["last_step"] == 40
    threshold = max(multiple * step_s, floor_s)
    assert fault.at - hung_at <= threshold + tick_s + 1.0  # within the threshold plus a tick
    assert run.excluded == {}  # a hang blames no node
    assert w.logs["/logs/llm-1000.out"].closed


def test_a_long_announced_save_is_waited_for_and_a_real_hang_after_it_is_not(tmp_path):
    settings = HangSettings(multiple=3, floor_s=5, cap_s=600, startup_grace_s=60, pause_cap_s=300)
    w = SimWorld(tmp_path, SPEC, probe=False, hang=settings)
    step = 0
    saved_at = None
    for _ in range(1000):
        w.engine.tick()  # the trainer acts between the tick and the wait
        run = w.run()
        if run.attempt and run.attempt.seq == 1:
            break
        path = f"/logs/llm-{run.attempt.job_id}.out" if run.attempt else None
        if run.attempt and run.attempt.started_at and path in w.logs:
            if step < 30:
                step += 1
                w.logs[path].append(megatron(step))
            elif saved_at is None:
                w.logs[path].append(f" saving checkpoint at iteration {step:8d} to /ckpt")
                saved_at = w.clock.now()
            elif w.clock.now() - saved_at == 120:  # a two-minute synchronous save, then steps again
                w.logs[path].append(f" successfully saved checkpoint at iteration {step:8d} to /ckpt")
                w.logs[path].append(megatron(step + 1))
                step = 31
        w.clock.wait(1.0)
    hang = w.events(EventKind.FAULT)[0]
    assert hang.evidence["last_step"] == 31  # not the save at step 30: the silence after it
    assert hang.at - saved_at > 120


def _steps_logged(w: SimWorld, steps: range, every: float) -> str:
    """The first attempt runs and logs ``steps``, one each ``every`` seconds; returns its log's path."""
    w.until(lambda: w.running(0))
    path = f"/logs/llm-{w.run().attempt.job_id}.out"
    w.until(lambda: path in w.logs, limit=5)
    for step in steps:
        w.logs[path].append(megatron(step))
        w.tick(every)
    return path


@pytest.mark.parametrize("restart_daemon", [False, True])
def test_a_restarted_daemon_judges_a_hang_on_the_pace_it_already_learned(tmp_path, restart_daemon):
    """40 steps at 10 s, then the trainer hangs just as the daemon restarts: the new daemon knows
    the attempt's pace from the store, so the hang is caught within 3 x 10 s (plus the tick), not
    after the start-up grace meant for attempts whose pace nobody knows yet."""
    settings = HangSettings(multiple=3, floor_s=5, cap_s=600, startup_grace_s=900)
    w = SimWorld(tmp_path, SPEC, probe=False, hang=settings)
    _steps_logged(w, range(1, 41), every=10.0)
    if restart_daemon:
        w.new_engine()
    hung_at = w.clock.now()
    w.until(lambda: w.events(EventKind.FAULT), limit=200, interval=1.0)
    fault = w.events(EventKind.FAULT)[0]
    assert "hang" in fault.message and "learned step interval" in fault.message
    assert fault.at - hung_at <= 3 * 10.0 + 2.0


def test_the_save_cost_is_measured_from_the_log_and_feeds_the_checkpoint_advice(tmp_path):
    """Issue 21 item 6: a save announced in the log (Megatron's "saving checkpoint" ... "successfully
    saved") stalls it; the stall, measured between the reads, is the attempt's save cost, handed on
    with its replacement's restart and used by `logbook goodput` for Young/Daly."""
    from supervisor.domain.goodput.account import goodput, measured_save_s

    settings = HangSettings(multiple=3, floor_s=60, cap_s=600, startup_grace_s=900)
    w = SimWorld(tmp_path, SPEC, probe=False, hang=settings)
    path = _steps_logged(w, range(1, 11), every=5.0)
    w.logs[path].append("saving checkpoint at iteration      10 to /ckpt")
    w.ticks(6, 5.0)  # a 30 s synchronous save
    w.logs[path].append("  successfully saved checkpoint from iteration      10 to /ckpt")
    w.logs[path].append(megatron(11))
    w.ticks(2, 5.0)
    assert w.run().attempt.save_s == 30.0
    w.cluster.finish_job(w.run().attempt.job_id, exit_code=1)
    w.until(lambda: w.running(1), limit=200)
    restarted = w.events(EventKind.RESTARTED)[0]
    assert restarted.evidence["save_s"] == 30.0
    events, attempts = w.store.events("llm"), w.store.attempts("llm")
    assert measured_save_s(events, attempts) == 30.0
    fault = [e for e in events if e.kind is EventKind.FAULT][0]
    assert fault.evidence["detection_s"] >= 0.0  # from Slurm's end time to the decision
    advice = goodput("llm", attempts, events, now=w.clock.now()).advice(measured_save_s(events, attempts))
    assert advice.save_s == 30.0
