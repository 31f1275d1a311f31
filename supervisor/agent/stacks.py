"""The node side of a hang's stack capture: ``python -m supervisor.agent.stacks --job J``, run by
the daemon in an overlapping step on every node of the hung job (adapters/slurm/stack_capture.py).

It finds the job's training processes on this node — those whose environment (``/proc/PID/environ``,
as they were started) holds ``SLURM_JOB_ID=J``, this node's ``SLURMD_NODENAME`` and a ``RANK`` (torchrun's workers, or any launcher
that sets it; else ``SLURM_PROCID`` of a Python process in another step) — runs ``py-spy dump
--json`` on each with a timeout, and prints one bounded JSON line per process, then a closing line
for the node. When py-spy is missing or may not attach (ptrace refused: ``kernel.yama.ptrace_scope``,
a container without CAP_SYS_PTRACE) the lines say why; the daemon cancels on time regardless.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from supervisor.domain.stacks.dumps import RankDump, rank_dump
from supervisor.domain.text_safety import printable

MAX_DUMP = 4 << 20  # bytes of py-spy's output read per process
MAX_PROCESSES = 64
PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")


@dataclass(frozen=True)
class Target:
    pid: int
    rank: int


def environ_of(path: Path) -> dict[str, str]:
    try:
        raw = path.read_bytes()[: 1 << 20]
    except OSError:  # gone, or another user's
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _rank(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key, "")
    return int(value) if value.isdigit() and len(value) < 8 else None


def training_processes(
    job_id: int, node: str, proc: Path = Path("/proc"), own: Mapping[str, str] = os.environ
) -> list[Target]:
    """The job's ranks on this node: RANK when set, else SLURM_PROCID of a Python process of
    another step than this capture's. A process slurmd started for another node of the job
    (``SLURMD_NODENAME``) is that node's: several nodes may share one host (and /proc)."""
    ranked: list[Target] = []
    stepped: list[Target] = []
    for entry in sorted(proc.iterdir(), key=lambda p: p.name):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        env = environ_of(entry / "environ")
        if env.get("SLURM_JOB_ID") != str(job_id) or env.get("SLURMD_NODENAME", node) != node:
            continue
        if (rank := _rank(env, "RANK")) is not None:
            ranked.append(Target(int(entry.name), rank))
        elif (rank := _rank(env, "SLURM_PROCID")) is not None and _python(entry) and env.get("SLURM_STEP_ID") != own.get("SLURM_STEP_ID"):  # fmt: skip
            stepped.append(Target(int(entry.name), rank))
    return (ranked or stepped)[:MAX_PROCESSES]


def _python(entry: Path) -> bool:
    try:
        return (entry / "comm").read_text().startswith("python")
    except OSError:
        return False


def _refusal(stderr: str) -> str:
    """Why py-spy failed, in words: ptrace refused (with the kernel's setting), or its message."""
    text = printable(stderr.strip(), 200)
    if "ermission" in stderr or "not permitted" in stderr:
        try:
            scope = PTRACE_SCOPE.read_text().strip()
        except OSError:
            scope = "not set"
        return f"ptrace refused (kernel.yama.ptrace_scope {printable(scope, 8)}): {text}"
    return f"py-spy failed: {text}"


def dump(py_spy: str, target: Target, timeout_s: float, native: bool) -> tuple[object, str | None]:
    """py-spy's threads for one process, or why there are none."""
    argv = [py_spy, "dump", "--json", "--pid", str(target.pid), *(["--native"] if native else [])]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)  # noqa: S603
    except FileNotFoundError:
        return None, f"py-spy not found ({printable(py_spy, 200)}): install the stacks extra on the nodes"
    except subprocess.TimeoutExpired:
        return None, f"py-spy did not answer within {timeout_s:.1f} s"
    if done.returncode != 0:
        return None, _refusal(done.stderr.decode(errors="replace")[:4096])
    try:
        return json.loads(done.stdout[:MAX_DUMP]), None
    except ValueError:
        return None, "py-spy's output is not JSON (or over the size bound)"


def _round(args: argparse.Namespace, targets: list[Target], until: float) -> dict[int, RankDump]:
    """One py-spy dump of every target, bounded by ``until`` (monotonic); a target not reached says so."""
    out: dict[int, RankDump] = {}
    for target in targets:
        left = until - time.monotonic()
        threads, error = (None, "the node's deadline came first") if left <= 0.2 else dump(args.py_spy, target, min(10.0, left), args.native)  # fmt: skip
        raw = {"rank": target.rank, "pid": target.pid, "threads": threads if isinstance(threads, list) else []}
        made = rank_dump({**raw, "error": error}, args.node)
        if made is not None:
            out[target.pid] = made
    return out


def _moved(first: RankDump, second: RankDump | None) -> bool | None:
    if second is None or first.error or second.error:
        return None
    return first.main_frames != second.main_frames


def capture(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Two samples ``args.again`` seconds apart (a hung rank's stack stands still; one that moved
    says the job still runs), one line per process, then the closing line."""
    began = time.monotonic()
    targets = training_processes(args.job, args.node)
    first = _round(args, targets, began + args.timeout * 0.45)
    second: dict[int, RankDump] = {}
    if args.again > 0 and any(d.error is None for d in first.values()):
        time.sleep(min(args.again, max(0.0, args.timeout * 0.5 - (time.monotonic() - began))))
        second = _round(args, [t for t in targets if first.get(t.pid) and first[t.pid].error is None], began + args.timeout)  # fmt: skip
    errors = []
    for made in first.values():
        _print(out, {**made.to_json(), "moved": _moved(made, second.get(made.pid)), "node": args.node})
        errors += [made.error] if made.error else []
    if not targets:
        errors.append(f"no training process of job {args.job} on this node")
    why = errors[0] if errors and len(errors) >= len(targets) else None  # every process failed: say why
    _print(out, {"node": args.node, "closing": True, "processes": len(targets), "error": why, "took_s": round(time.monotonic() - began, 3)})  # fmt: skip
    return 0


def _print(out: TextIO, obj: Mapping[str, object]) -> None:
    print(json.dumps(obj, ensure_ascii=True), file=out, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m supervisor.agent.stacks", description=__doc__.splitlines()[0])
    p.add_argument("--job", type=int, required=True)
    p.add_argument("--timeout", type=float, default=20.0, help="seconds for the whole node")
    p.add_argument("--py-spy", default="py-spy")
    p.add_argument("--native", action="store_true")
    p.add_argument("--again", type=float, default=1.0, help="seconds between the two samples (0: one sample)")
    p.add_argument("--node", default=os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0])
    return capture(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
