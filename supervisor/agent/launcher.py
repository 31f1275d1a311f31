"""The in-allocation launcher (``slurm-supervisor launch -- CMD...``, run by the batch script on the
batch host): it runs the training as a job step on ``nodes`` of the job's nodes and converges on
the step the daemon wants (docs/in-allocation.md).

Generation 0 starts at once on the first ``nodes`` of the allocation, without asking anyone. Every
``poll_s`` the launcher reports its step (generation, alive, exit code, nodes, host) and reads the
goal: a newer generation stops the step (SIGTERM to srun, which signals the tasks; SIGKILL after
``stop_grace_s``) and starts it on the goal's nodes with the goal's resume variables. A goal whose
nodes are not ``nodes`` names of this job's allocation is refused. A step that ends by itself with
success ends the launcher; after a failure it waits ``decision_wait_s`` for a new generation (the
daemon may be about to swap a node that killed it), then exits with the step's code; a step that
exits with the continue code (``[continuation]``) ends it at once with that code, and the
continuation signal sent to the batch shell (``--signal=B:SIG``) is handed to the step's srun,
which forwards it to the tasks. SIGTERM (the job cancelled) stops the step and ends the launcher.
Argv lists only.

The step's code is srun's, which under torchrun is never the trainer's: torchrun exits 0 or 1, and
the first node to end takes the others down (``--kill-on-bad-exit``: 143). With ``exit_file`` the
trainer's rank 0 writes its own code there (``SSV_STEP_EXIT_FILE`` in the step's environment); when
srun ended unsuccessfully, a code found there — written since this generation started, by this
account — is the step's.

Beside generation 0 it starts the pre-flight check of the hot spares (``spare_check``: one
overlapping step over the allocation's other nodes, bounded by ``spare_check_timeout_s``;
supervisor.agent.spare_check): it never delays or stops the training step, and ends with the launcher.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from supervisor.adapters.web.launcher_channel import LauncherGoal, LauncherPoll
from supervisor.agent.launcher_client import ChannelClient
from supervisor.agent.spare_check import SpareCheck, spare_check_argv

log = structlog.get_logger(__name__)

_STEP_ENV = re.compile(r"^SSV_[A-Z0-9_]{1,40}$")  # what a goal may set in the step's environment


@dataclass(frozen=True)
class LaunchSettings:
    command: tuple[str, ...]
    nodes: int
    allocation: tuple[str, ...]  # the job's nodes (SLURM_JOB_NODELIST, expanded), in Slurm's order
    job_id: int
    host: str
    ntasks_per_node: int = 1
    poll_s: float = 1.0
    decision_wait_s: float = 30.0
    stop_grace_s: float = 10.0
    srun: str = "srun"
    spare_check: tuple[str, ...] = ()  # the one-shot check run on every hot spare at start; () none
    spare_check_timeout_s: float = 60.0
    # The trainer's survivors save when a rank fails ([checkpoints] save_on_failure_s): srun leaves
    # the other tasks this long after the first one ends (0: ends them at once, --kill-on-bad-exit).
    save_on_failure_s: float = 0.0
    # [continuation]: the trainer's "saved, continue me" (SSV_CONTINUE_EXIT_CODE). A step that
    # exits with it ends the job at once with it (a planned end: no swap to wait for).
    continue_code: int | None = None
    # Where the trainer's rank 0 writes its exit code (None: srun's code is the step's).
    exit_file: str | None = None


# Which of the step's nodes do not answer (their slurmd): srun notices a dead node only once
# Slurm calls it DOWN (~2 x SlurmdTimeout, measured), the daemon only at its next tick.
Reach = Callable[[tuple[str, ...]], tuple[str, ...]]
URGENT_POLL_S = 0.2  # while a step node does not answer: the daemon's swap is coming


class _Attention(threading.Event):
    """``stopping``: setting it also cuts the launcher's wait short."""

    def __init__(self, nudge: threading.Event) -> None:
        super().__init__()
        self._nudge = nudge

    def set(self) -> None:
        super().set()
        self._nudge.set()


class Step:
    """One generation's ``srun``; ``on_exit`` is called (from a watcher thread) when it ends.
    ``exit_file``: the trainer's own code, read once srun ended unsuccessfully (module docstring)."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], on_exit: Callable[[], object], exit_file: str | None = None
    ) -> None:
        self.argv = list(argv)
        self.exit_file = exit_file
        self._code: int | None = None
        self.proc = subprocess.Popen(self.argv, env=dict(env))  # noqa: S603 - argv list
        threading.Thread(target=lambda: (self.proc.wait(), on_exit()), daemon=True).start()

    def exit_code(self) -> int | None:
        if self._code is None:
            code = self.proc.poll()
            if code is None:
                return None
            code = 128 - code if code < 0 else code
            trainer = trainer_code(self.exit_file) if code and self.exit_file else None
            if trainer is not None and trainer != code:
                log.info("launcher_step_code_from_exit_file", srun=code, trainer=trainer)
            self._code = trainer if trainer is not None else code
        return self._code

    def stop(self, grace_s: float) -> None:
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Launcher:
    def __init__(self, settings: LaunchSettings, client: ChannelClient | None, reach: Reach | None = None) -> None:
        self.s = settings
        self.client = client
        self.reach = reach
        self._nudge = threading.Event()  # the step ended, or a stop: report now, not at the next poll
        self.stopping: threading.Event = _Attention(self._nudge)
        self.generation = 0
        self.nodes = settings.allocation[: settings.nodes]
        self._env: dict[str, str] = {}
        self._refused = -1  # the generation last refused
        self._step: Step | None = None
        self._passed_on: int | None = None  # a continuation signal handed to the step, not yet logged

    def pass_on(self, signum: int) -> None:
        """The continuation signal reached the batch shell (``--signal=B:SIG``): hand it to the
        step's srun, which forwards it to the tasks (called from the signal handler)."""
        step = self._step
        if step is not None and step.proc.poll() is None:
            step.proc.send_signal(signum)
            self._passed_on = signum  # said in the log by the loop, not in a signal handler
            self._nudge.set()

    def run(self) -> int:
        step = self._start()
        check = self._check_spares()
        try:
            return self._converge(step)
        finally:
            if check is not None:
                check.stop()
            self._fresh_exit_file()  # read by now: nothing is left behind in the submit folder

    def _converge(self, step: Step) -> int:
        ended_at: float | None = None
        while not self.stopping.is_set():
            self._say_passed_on()
            code = step.exit_code()
            unreachable = self._unreachable(code)
            goal = self._poll(code, unreachable)
            if goal is not None:
                step.stop(self.s.stop_grace_s)
                self._adopt(goal)
                step, ended_at = self._start(), None
                continue
            if code == 0 or (code is not None and code == self.s.continue_code):
                return code  # done, or a planned end (the trainer saved): nothing to wait for
            if code is not None:
                ended_at = ended_at if ended_at is not None else time.monotonic()
                if time.monotonic() - ended_at >= self.s.decision_wait_s:
                    log.warning("launcher_step_failed", generation=self.generation, exit_code=code)
                    return code
            self._nudge.wait(min(self.s.poll_s, URGENT_POLL_S) if unreachable else self.s.poll_s)
            self._nudge.clear()  # a step's end that raced this is seen by exit_code() above next round
        step.stop(self.s.stop_grace_s)
        return 143

    def _say_passed_on(self) -> None:
        signum, self._passed_on = self._passed_on, None
        if signum is not None:
            log.info("launcher_signal_passed_on", signal=signal.Signals(signum).name, generation=self.generation)

    def argv(self) -> list[str]:
        s, n = self.s, len(self.nodes)
        return [
            s.srun,
            f"--nodes={n}",
            f"--ntasks={n * s.ntasks_per_node}",
            f"--ntasks-per-node={s.ntasks_per_node}",
            f"--nodelist={','.join(self.nodes)}",
            *self._on_bad_exit(),
            # Until the dead node is DOWN, slurmctld keeps the stopped step's resources on the
            # survivors and a new step waits for them (measured: docs/in-allocation.md); the old
            # srun has exited by now, so sharing them with what is left of it is safe.
            "--overlap",
            *s.command,
        ]

    def _on_bad_exit(self) -> list[str]:
        """One failed task ends the step at once — unless the survivors save on failure: then srun
        gives them ``save_on_failure_s`` (whole seconds, rounded up) after the first task ended."""
        if self.s.save_on_failure_s <= 0:
            return ["--kill-on-bad-exit=1"]
        return ["--kill-on-bad-exit=0", f"--wait={math.ceil(self.s.save_on_failure_s)}"]

    def _start(self) -> Step:
        # SSV_WORLD_NONCE: one random value per world, shared by its ranks only: the survivors' claim
        # file is named after it, so nobody who can write the checkpoint root can pre-create it
        nonce = secrets.token_hex(16)
        env = {**os.environ, **self._env, "SSV_STEP_GENERATION": str(self.generation), "SSV_WORLD_NONCE": nonce}
        exit_file = self._fresh_exit_file()
        if exit_file is not None:
            env["SSV_STEP_EXIT_FILE"] = exit_file
        log.info("launcher_step_start", generation=self.generation, nodes=list(self.nodes))
        self._step = Step(self.argv(), env, self._nudge.set, exit_file)
        return self._step

    def _fresh_exit_file(self) -> str | None:
        """The exit file, emptied of what an earlier generation (or anyone before) left there; None
        when it cannot be removed: then srun's code is the step's."""
        path = self.s.exit_file
        if path is None:
            return None
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("launcher_exit_file_unusable", path=path[:200], error=exc.strerror)
            return None
        return path

    def _check_spares(self) -> SpareCheck | None:
        """The pre-flight check of the hot spares (the allocation's nodes outside generation 0), started."""
        spares = self.s.allocation[self.s.nodes :]
        if not spares or not self.s.spare_check:
            return None
        check = SpareCheck(
            spare_check_argv(self.s.srun, spares, self.s.spare_check), spares, self.s.spare_check_timeout_s
        )
        log.info("launcher_spare_check_start", spares=list(spares[:16]), count=len(spares))
        check.start()
        return check

    def _unreachable(self, code: int | None) -> tuple[str, ...]:
        """The running step's nodes that do not answer (none asked once the step has ended)."""
        if self.reach is None or code is not None:
            return ()
        return self.reach(self.nodes)

    def _poll(self, code: int | None, unreachable: tuple[str, ...] = ()) -> LauncherGoal | None:
        """The daemon's goal when it asks for a newer generation this launcher can run; else None."""
        if self.client is None:
            return None
        report = LauncherPoll(
            self.s.job_id, self.generation, code is None, list(self.nodes), self.s.host, code, list(unreachable)
        )
        goal = self.client.poll(report)
        if goal is None or goal.generation <= self.generation or not goal.nodes:
            return None
        if len(goal.nodes) != self.s.nodes or not set(goal.nodes) <= set(self.s.allocation):
            if goal.generation != self._refused:  # said once per generation
                log.error("launcher_goal_refused", generation=goal.generation, nodes=goal.nodes[:16])
                self._refused = goal.generation
            return None
        return goal

    def _adopt(self, goal: LauncherGoal) -> None:
        assert goal.nodes is not None
        self.generation, self.nodes = goal.generation, tuple(goal.nodes)
        self._env = {k: v for k, v in goal.env.items() if _STEP_ENV.match(k)}


EXIT_FILE_MAX_BYTES = 16  # "75\n" and some blanks: anything longer is not an exit code


def trainer_code(path: str) -> int | None:
    """The exit code the trainer wrote to ``path`` (1-255), else None: no file, not this account's,
    or not a code. Never follows a link (the file lies in a folder the job's tasks can write)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        text = f.read(EXIT_FILE_MAX_BYTES + 1).strip()
    if len(text) > EXIT_FILE_MAX_BYTES or not text.isdigit() or not 1 <= int(text) <= 255:
        return None
    return int(text)
