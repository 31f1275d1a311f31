"""The launcher's pre-flight check of the hot spares (docs/in-allocation.md): one overlapping job
step runs a one-shot health check on every spare (by default ``slurm-supervisor agent --once
--send``: the report goes to the daemon with the run's token, so a spare whose GPU is fatal is
kept out of the hot spares and drained before a swap would pick it).

It runs in a thread of its own beside the training step and never delays or stops it: its end,
its failure or its timeout is logged and nothing else happens. Argv lists only.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

import structlog

log = structlog.get_logger(__name__)

SPARE_CHECK_NAME = "ssv-spare-check"  # the step's name (squeue --steps, sacct): what it is for
FATAL_EXIT = 2  # ``agent --once``: a fatal finding (srun exits with its tasks' highest code)


def spare_check_argv(srun: str, spares: Sequence[str], check: Sequence[str]) -> list[str]:
    """One task per spare, sharing the spares' resources with whatever holds them (``--overlap``);
    one spare's fatal exit must not kill the checks of the others (``--kill-on-bad-exit=0``)."""
    k = len(spares)
    return [
        srun,
        f"--job-name={SPARE_CHECK_NAME}",
        "--overlap",
        f"--nodes={k}",
        f"--ntasks={k}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(spares)}",
        "--kill-on-bad-exit=0",
        *check,
    ]


class SpareCheck:
    """The check's ``srun``, watched by a daemon thread: ended (logged) or killed at ``timeout_s``."""

    def __init__(
        self,
        argv: Sequence[str],
        spares: Sequence[str],
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        stop_grace_s: float = 5.0,
    ) -> None:
        self.argv, self.spares = list(argv), list(spares)
        self.timeout_s, self.stop_grace_s = timeout_s, stop_grace_s
        self._env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # the watcher starts the process; stop() may come at any time
        self._stopped = False
        self._thread = threading.Thread(target=self._watch, name="spare-check", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        self._thread.join(timeout_s)

    def stop(self) -> None:
        """The launcher ends: so does the check (within ``stop_grace_s``)."""
        with self._lock:
            self._stopped = True
            proc = self._proc
        if proc is not None:
            _end(proc, self.stop_grace_s)

    def _watch(self) -> None:
        started = time.monotonic()
        with self._lock:
            if self._stopped:
                return
            try:
                self._proc = subprocess.Popen(self.argv, env=self._env, stdin=subprocess.DEVNULL)  # noqa: S603
            except OSError as exc:
                log.error("launcher_spare_check_failed", spares=self.spares, error=f"{self.argv[0]}: {exc.strerror}")
                return
            proc = self._proc
        try:
            code = proc.wait(self.timeout_s)
        except subprocess.TimeoutExpired:
            _end(proc, self.stop_grace_s)
            log.warning("launcher_spare_check_timed_out", spares=self.spares, timeout_s=self.timeout_s)
            return
        self._ended(code, time.monotonic() - started)

    def _ended(self, code: int, took_s: float) -> None:
        took = round(took_s, 2)
        if code == 0:
            log.info("launcher_spare_check_done", spares=self.spares, exit_code=code, took_s=took)
        elif code == FATAL_EXIT:  # the daemon has the evidence: it keeps the spare out and drains it
            log.warning("launcher_spare_check_found_fatal", spares=self.spares, exit_code=code, took_s=took)
        elif not self._stopped:
            log.error("launcher_spare_check_failed", spares=self.spares, exit_code=code, took_s=took)


def _end(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM (srun passes it to the tasks), SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
