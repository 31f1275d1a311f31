"""The in-allocation launcher converging on the daemon's goal (supervisor.agent.launcher), with a
stand-in ``srun`` (a script that logs its argv and environment) and a scripted channel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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


# -- [continuation]: the planned end in in-allocation mode (issue 31) ----------------------------

TRAINER_ON_USR1 = (
    'trap \'echo got-usr1 >> "$(dirname "$0")/srun.log"; exit 75\' USR1\n'
    'echo ready >> "$(dirname "$0")/srun.log"\n'
    "while :; do sleep 0.05; done"
)


def test_the_continuation_signal_is_handed_to_the_step_and_its_continue_code_ends_the_job_at_once(
    tmp_path: Path,
) -> None:
    # Before: the launcher had no way to pass the batch shell's signal on, and a step that exited
    # 75 was held for decision_wait_s like a failure (here an hour) before the job ended.
    srun, log = fake_srun(tmp_path, TRAINER_ON_USR1)
    launcher = Launcher(settings(srun, decision_wait_s=3600.0, continue_code=75), Channel())  # type: ignore[arg-type]
    thread, result = run_in_thread(launcher)
    wait(lambda: log.exists() and "ready" in log.read_text())
    launcher.pass_on(signal.SIGUSR1)
    thread.join(10)
    assert result == [75] and "got-usr1" in log.read_text()


def test_slurm_supervisor_launch_passes_the_continuation_signal_on_and_exits_with_the_continue_code(
    tmp_path: Path,
) -> None:
    srun, log = fake_srun(tmp_path, TRAINER_ON_USR1)
    env = {
        **os.environ,
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_JOB_ID": "7",
        "SLURMD_NODENAME": "n1",
        "SSV_CONTINUE_SIGNAL": "USR1",
        "SSV_CONTINUE_EXIT_CODE": "75",
    }
    argv = [sys.executable, "-m", "supervisor", "launch", "--no-spare-check", "--decision-wait", "3600", "--", "train"]
    proc = subprocess.Popen(argv, env=env)
    try:
        wait(lambda: log.exists() and "ready" in log.read_text(), timeout=30)
        proc.send_signal(signal.SIGUSR1)  # what Slurm's --signal=B:USR1@LEAD does to the batch shell
        assert proc.wait(30) == 75
    finally:
        proc.kill()
    assert "got-usr1" in log.read_text()


# With torchrun the step's srun never exits with the trainer's code: torchrun says only 0 or 1, and
# the first node to end takes the others down (--kill-on-bad-exit: 143). The trainer's rank 0 writes
# its code to the exit file; the launcher reads it when the step ended unsuccessfully.
TORCHRUN_ON_USR1 = (
    "trap 'echo 75 > \"$SSV_STEP_EXIT_FILE\"; exit 143' USR1\n"
    'echo ready >> "$(dirname "$0")/srun.log"\n'
    "while :; do sleep 0.05; done"
)


def test_the_trainers_exit_file_gives_the_step_its_code_when_torchrun_and_srun_do_not(tmp_path: Path) -> None:
    exit_file = tmp_path / "exit"  # the launcher names it to the step: SSV_STEP_EXIT_FILE
    srun, log = fake_srun(tmp_path, TORCHRUN_ON_USR1)
    kw = dict(decision_wait_s=3600.0, continue_code=75, exit_file=str(exit_file))
    channel = Channel()
    launcher = Launcher(settings(srun, **kw), channel)  # type: ignore[arg-type]
    thread, result = run_in_thread(launcher)
    wait(lambda: log.exists() and "ready" in log.read_text())
    launcher.pass_on(signal.SIGUSR1)
    thread.join(10)
    assert result == [75] and channel.reports[-1].exit_code == 75
    assert not exit_file.exists()  # nothing left in the submit folder


def test_an_exit_file_left_from_before_the_step_started_is_not_read(tmp_path: Path) -> None:
    exit_file = tmp_path / "exit"
    exit_file.write_text("75\n")  # an earlier generation's, or a stranger's before the job
    srun, _ = fake_srun(tmp_path, "exit 1")
    launcher = Launcher(settings(srun, continue_code=75, exit_file=str(exit_file)), Channel())  # type: ignore[arg-type]
    thread, result = run_in_thread(launcher)
    thread.join(5)
    assert result == [1]


def test_an_exit_file_that_holds_no_exit_code_leaves_sruns(tmp_path: Path) -> None:
    exit_file = tmp_path / "exit"
    srun, _ = fake_srun(tmp_path, f"printf '75x%.0s' {{1..5000}} > {exit_file}; exit 143")
    launcher = Launcher(settings(srun, continue_code=75, exit_file=str(exit_file)), Channel())  # type: ignore[arg-type]
    thread, result = run_in_thread(launcher)
    thread.join(5)
    assert result == [143]
