"""The in-allocation launcher converging on the daemon's goal (supervisor.agent.launcher), with a
stand-in ``srun`` (a script that logs its argv and environment) and a scripted channel."""

from __future__ import annotations

import threading
from pathlib import Path

from supervisor.adapters.web.launcher_channel import LauncherGoal, LauncherPoll
from supervisor.agent.launcher import Launcher, LaunchSettings


class Channel:
    """Answers each poll with the goal set now; remembers every report."""

    def __init__(self) -> None:
        self.goal = LauncherGoal(7, 0)
        self.reports: list[LauncherPoll] = []

    def poll(self, report: LauncherPoll) -> LauncherGoal | None:
        self.reports.append(report)
        return self.goal


def fake_srun(tmp_path: Path, body: str = "exec sleep 30") -> tuple[Path, Path]:
    log = tmp_path / "srun.log"
    script = tmp_path / "srun"
    script.write_text(f'#!/bin/bash\necho "gen=$SSV_STEP_GENERATION resume=$SSV_RESUME_STEP $*" >> {log}\n{body}\n')
    script.chmod(0o755)
    return script, log


def settings(srun: Path, **kw) -> LaunchSettings:
    base = dict(
        command=("train", "--x"),
        nodes=2,
        allocation=("n1", "n2", "n3"),
        job_id=7,
        host="n1",
        poll_s=0.02,
        decision_wait_s=0.3,
        stop_grace_s=2.0,
        srun=str(srun),
    )
    return LaunchSettings(**{**base, **kw})


def run_in_thread(launcher: Launcher) -> tuple[threading.Thread, list[int]]:
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(launcher.run()), daemon=True)
    thread.start()
    return thread, result


def wait(predicate, timeout: float = 5.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if predicate():
            return
        done.wait(0.02)
    raise AssertionError("condition not met")


def test_generation_0_starts_on_the_first_nodes_and_a_new_goal_relaunches_on_its_nodes(tmp_path: Path) -> None:
    srun, log = fake_srun(tmp_path)
    channel = Channel()
    launcher = Launcher(settings(srun), channel)  # type: ignore[arg-type]
    thread, result = run_in_thread(launcher)
    wait(lambda: log.exists() and channel.reports)
    assert "--nodelist=n1,n2" in log.read_text() and "--overlap train --x" in log.read_text()
    channel.goal = LauncherGoal(7, 1, ["n1", "n3"], {"SSV_RESUME_STEP": "100", "LD_PRELOAD": "/evil.so"})
    wait(lambda: any(r.generation == 1 and r.alive for r in channel.reports))
    lines = log.read_text().splitlines()
    assert lines[-1].startswith("gen=1 resume=100 ") and "--nodelist=n1,n3" in lines[-1] and len(lines) == 2
    assert channel.reports[-1].nodes == ["n1", "n3"] and channel.reports[-1].host == "n1"
    launcher.stopping.set()
    thread.join(5)
    assert result == [143]


def test_a_goal_outside_the_allocation_is_refused(tmp_path: Path) -> None:
    srun, log = fake_srun(tmp_path)
    channel = Channel()
    channel.goal = LauncherGoal(7, 1, ["n1", "n9"])
    launcher = Launcher(settings(srun), channel)  # type: ignore[arg-type]
    thread, _ = run_in_thread(launcher)
    wait(lambda: len(channel.reports) >= 5)
    launcher.stopping.set()
    thread.join(5)
    assert len(log.read_text().splitlines()) == 1 and launcher.generation == 0


def test_a_failed_step_waits_for_a_decision_then_exits_with_its_code(tmp_path: Path) -> None:
    srun, _ = fake_srun(tmp_path, "exit 3")
    channel = Channel()
    thread, result = run_in_thread(Launcher(settings(srun), channel))  # type: ignore[arg-type]
    thread.join(5)
    assert result == [3] and not channel.reports[-1].alive and channel.reports[-1].exit_code == 3


def test_a_step_that_succeeds_ends_the_launcher_without_a_daemon(tmp_path: Path) -> None:
    srun, _ = fake_srun(tmp_path, "exit 0")
    thread, result = run_in_thread(Launcher(settings(srun), None))
    thread.join(5)
    assert result == [0]


def test_a_run_that_saves_on_failure_lets_the_survivors_finish_their_save() -> None:
    """srun's --kill-on-bad-exit=1 ends every task the moment one fails: the survivors would be
    killed in the middle of their save. Saving on failure: the other tasks are left --wait
    seconds after the first one ends, then terminated by srun."""
    plain = Launcher(settings(Path("srun")), None).argv()
    assert "--kill-on-bad-exit=1" in plain and not any(a.startswith("--wait") for a in plain)
    saving = Launcher(settings(Path("srun"), save_on_failure_s=90.5), None).argv()
    assert "--kill-on-bad-exit=0" in saving and "--wait=91" in saving and "--kill-on-bad-exit=1" not in saving
    assert saving[-2:] == ["train", "--x"]
