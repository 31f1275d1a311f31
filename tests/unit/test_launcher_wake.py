"""A launcher that reports its step dead wakes the daemon's loop at once (issue 16: detection
speed). The wake is a hint only: the tick still decides from the store and Slurm."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.wake_clock import WakeableClock
from supervisor.adapters.web.launcher_channel import LauncherChannel
from supervisor.adapters.web.messages import Request
from supervisor.domain.run import RestartMode
from supervisor.engine.loop.daemon import Pacing, run_loop
from supervisor.testing.kit.specs import spec

SPEC = spec(script="/s.sh", restart_mode=RestartMode.IN_ALLOCATION, hot_spares=1)
ALIVE = {"job_id": 7, "generation": 0, "alive": True, "nodes": ["n1", "n2"], "host": "n1"}
DEAD = {**ALIVE, "alive": False, "exit_code": 137}
POLL_S = 60.0  # the loop would sleep a minute without the wake


@dataclass
class _Result:
    ok: bool = True
    acted: bool = False
    urgent: bool = False
    retry_in: float | None = None
    decisions: tuple[()] = ()
    error: str | None = None


class _Engine:
    """What run_loop reads of the engine; each tick is signalled to the test."""

    def __init__(self, clock: WakeableClock) -> None:
        self.clock = clock
        self.ticked = threading.Semaphore(0)

    def adopt(self) -> list[object]:
        return []

    def tick(self) -> _Result:
        self.ticked.release()
        return _Result()


def _channel(tmp_path: Path, clock: WakeableClock) -> LauncherChannel:
    store = SqliteStore(tmp_path)
    store.add_run(SPEC, 1.0)
    store.add_attempt("llm", 7, 0, 2.0)
    store.attempt_started("llm", 0, ("n1", "n2", "n3"), 3.0)
    return LauncherChannel({"llm": "secret-token"}, store, clock, wake=clock.wake)


def _post(channel: LauncherChannel, body: dict[str, object]) -> int:
    headers = {"authorization": "Bearer secret-token"}
    return channel.handle(Request("POST", "/v1/launcher/llm", "", headers, json.dumps(body).encode(), "n1")).status


def test_a_dead_step_report_wakes_the_loop_before_the_poll_interval(tmp_path: Path) -> None:
    clock = WakeableClock()
    channel, engine = _channel(tmp_path, clock), _Engine(clock)
    loop = threading.Thread(target=run_loop, args=(engine, Pacing(POLL_S)), daemon=True)
    loop.start()
    try:
        assert engine.ticked.acquire(timeout=5.0)  # the first tick
        assert _post(channel, ALIVE) == 200
        assert not engine.ticked.acquire(timeout=0.3)  # an alive step is no reason to look again
        assert _post(channel, DEAD) == 200
        assert engine.ticked.acquire(timeout=5.0)  # woken: well before the 60 s poll
        assert _post(channel, DEAD) == 200  # the same dead step again: no new wake
        assert not engine.ticked.acquire(timeout=0.3)
    finally:
        clock.stop()
        loop.join(5.0)
    assert not loop.is_alive()  # a stop still ends the loop at once


def test_step_nodes_the_launcher_cannot_reach_wake_the_loop(tmp_path: Path) -> None:
    woken: list[str] = []
    channel = _channel(tmp_path, WakeableClock())
    channel.wake = lambda: woken.append("woken")
    assert _post(channel, ALIVE) == 200 and not woken
    assert _post(channel, {**ALIVE, "unreachable": ["n2"]}) == 200 and woken == ["woken"]
    assert _post(channel, {**ALIVE, "unreachable": ["n2"]}) == 200 and woken == ["woken"]  # no news: no wake
    assert _post(channel, {**ALIVE, "unreachable": ["n1", "n2"]}) == 200 and len(woken) == 2
    assert _post(channel, {**ALIVE, "unreachable": ["n2;x"]}) == 400  # names bounded like the rest


def test_a_wake_cuts_the_wait_short_and_a_stop_still_ends_it() -> None:
    clock = WakeableClock()
    clock.wake()
    assert clock.wait(30.0) is False  # woken: not a stop
    clock.stop()
    assert clock.wait(30.0) is True and clock.wait(30.0) is True
