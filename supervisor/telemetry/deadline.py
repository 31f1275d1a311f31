"""When this job ends: its time limit as epoch seconds, so a trainer can save on its own clock.

    export SSV_DEADLINE=${SSV_DEADLINE:-$(python -m supervisor.telemetry.deadline)}   # the batch script, once

``deadline()`` reads ``SSV_DEADLINE`` (set by the batch script, or by hand), else Slurm's
``SLURM_JOB_END_TIME`` (23.02+), else asks ``squeue -h -j $SLURM_JOB_ID -o %e`` once (Slurm 22.05
sets no variable): an argv list, a timeout, ``SLURM_TIME_FORMAT=%s`` so the answer is epoch
seconds, at most ``MAX_ANSWER_BYTES`` read. An answer that is not one time (``Unknown``, ``N/A``,
an error, a timeout) is None: unknown, never guessed. Ask once per job, in the batch script, not
on every rank: a thousand ranks asking squeue at once load the controller.
"""

from __future__ import annotations

import math
import os
import re
import selectors
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping

MAX_ANSWER_BYTES = 256
LATEST = 2**34  # past any real deadline (year 2514): a larger number is not a time
_EPOCH = re.compile(r"[0-9]{1,11}")
_JOB_ID = re.compile(r"[0-9]{1,12}(_[0-9]{1,9})?")


def deadline(env: Mapping[str, str] | None = None, *, timeout_s: float = 10.0, ask_squeue: bool = True) -> float | None:
    """The job's end in epoch seconds, or None when it is not known (module docstring). A
    ``SSV_DEADLINE`` that is not a time is ``ValueError``: it was set on purpose, and wrong."""
    env = os.environ if env is None else env
    own = env.get("SSV_DEADLINE", "").strip()
    if own:
        return _epoch(own, "SSV_DEADLINE")
    slurm = env.get("SLURM_JOB_END_TIME", "").strip()
    if _EPOCH.fullmatch(slurm) and 0 < int(slurm) < LATEST:
        return float(slurm)
    return _ask_squeue(env, timeout_s) if ask_squeue else None


def _epoch(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name}={text[:40]!r}: expected epoch seconds (date +%s)") from None
    if not math.isfinite(value) or not 0 < value < LATEST:
        raise ValueError(f"{name}={text[:40]!r}: expected epoch seconds (date +%s)")
    return value


def _ask_squeue(env: Mapping[str, str], timeout_s: float) -> float | None:
    job = env.get("SLURM_JOB_ID", "")
    exe = shutil.which("squeue", path=env.get("PATH"))
    if not _JOB_ID.fullmatch(job) or exe is None:
        return None
    try:
        with subprocess.Popen(
            [exe, "-h", "-j", job, "-o", "%e"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env={**env, "SLURM_TIME_FORMAT": "%s"},
        ) as proc:
            answer = _read_bounded(proc, timeout_s)
    except OSError:
        return None
    text = answer.decode("ascii", "replace").strip() if answer is not None else ""
    return float(text) if _EPOCH.fullmatch(text) and 0 < int(text) < LATEST else None


def _read_bounded(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes | None:
    """At most ``MAX_ANSWER_BYTES`` of its output within ``timeout_s``; None (the process killed)
    on a timeout, a longer answer or a failed exit."""
    assert proc.stdout is not None
    ends = time.monotonic() + timeout_s
    out = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while len(out) <= MAX_ANSWER_BYTES:
            left = ends - time.monotonic()
            if left <= 0 or not selector.select(left):
                return _killed(proc)
            chunk = os.read(proc.stdout.fileno(), MAX_ANSWER_BYTES + 1 - len(out))
            if not chunk:
                break
            out += chunk
    if len(out) > MAX_ANSWER_BYTES:
        return _killed(proc)
    try:
        proc.wait(max(ends - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
        return _killed(proc)
    return out if proc.returncode == 0 else None


def _killed(proc: subprocess.Popen[bytes]) -> bytes | None:
    proc.kill()
    proc.wait()
    return None


def main(env: Mapping[str, str] | None = None) -> int:
    """Print the deadline (whole seconds), or nothing when it is not known."""
    try:
        end = deadline(env)
    except ValueError as exc:
        print(f"supervisor.telemetry.deadline: {exc}", file=sys.stderr)
        return 2
    if end is not None:
        print(int(end))
    return 0


if __name__ == "__main__":
    sys.exit(main())
