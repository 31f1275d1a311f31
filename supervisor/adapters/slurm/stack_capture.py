"""A hung job's Python stacks, taken inside its allocation before it is cancelled (issue 35).

One overlapping job step (``srun --overlap --jobid=J``, one task per node, ``--label``) runs the
node agent's capture (``python -m supervisor.agent.stacks``) on every node of the job: it finds the
job's training processes there and prints one JSON line per process (py-spy's dump) and one closing
line for its node. Overlapping steps run as the job's own account, in its cgroup and with its
resources, and need nothing installed beyond what the spare check already needs; ssh would need
keys, the node guard runs as root (more than this needs).

Three parts, as the rest of the Slurm adapter: the argv builder (``capture_argv``), a pure parser
of the labelled output (``parse_capture``) and one runner (``SrunStackCapture``) with a hard
deadline: the step is stopped then (SIGTERM, SIGKILL two seconds later) and what arrived is kept.
Output is untrusted (a node's program wrote it): read up to ``MAX_OUTPUT`` bytes, lines over
``MAX_LINE`` dropped, at most ``MAX_PER_NODE`` processes a node, the node a line speaks for must
be one of the job's and claimed by one task only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

import hostlist
import structlog

from supervisor.domain.stacks.dumps import Capture, RankDump, rank_dump
from supervisor.domain.text_safety import printable

log = structlog.get_logger(__name__)

STEP_NAME = "ssv-stacks"
MAX_OUTPUT = 8 << 20  # bytes of the step's output read (the rest is discarded)
MAX_LINE = 512 << 10  # one process's line (the agent bounds its own to less)
MAX_PER_NODE = 64  # processes a node may report
_LABEL = re.compile(rb"^\s*(\d{1,7}): ?(.*)$")


@dataclass(frozen=True)
class CaptureSettings:
    deadline_s: float = 25.0  # the whole capture; the cancel follows at once
    native: bool = False  # py-spy --native (C/C++ frames too: slower, larger)
    py_spy: str = "py-spy"  # on the nodes
    agent: tuple[str, ...] = (sys.executable, "-m", "supervisor.agent.stacks")
    srun: str = "srun"
    stop_grace_s: float = 2.0


def capture_argv(s: CaptureSettings, job_id: int, nodes: Sequence[str]) -> list[str]:
    """One task per node of the job, beside its steps (``--overlap``); a node's failure leaves
    the others running (``--kill-on-bad-exit=0``); the agent's own deadline leaves the step time to
    print before the runner's."""
    per_node = max(1.0, s.deadline_s - s.stop_grace_s - 3.0)
    agent = [*s.agent, "--job", str(job_id), "--timeout", f"{per_node:g}", "--py-spy", s.py_spy]
    n = len(nodes)
    return [
        s.srun, f"--job-name={STEP_NAME}", f"--jobid={job_id}", "--overlap", f"--nodes={n}", f"--ntasks={n}",
        "--ntasks-per-node=1", f"--nodelist={hostlist.collect_hostlist(list(nodes))}", "--label", "--kill-on-bad-exit=0", "--quiet",
        *agent, *(["--native"] if s.native else []),
    ]  # fmt: skip


@dataclass
class _Parse:
    nodes: frozenset[str]
    task_node: dict[int, str] = field(default_factory=dict)
    claimed: set[str] = field(default_factory=set)
    dumps: dict[int, RankDump] = field(default_factory=dict)
    per_node: dict[str, int] = field(default_factory=dict)
    closed: dict[str, str | None] = field(default_factory=dict)  # node -> its agent's error (None: fine)
    dropped: int = 0

    def line(self, task: int, text: bytes) -> None:
        obj = _object(text)
        node = obj.get("node") if obj is not None else None
        if obj is None or not isinstance(node, str) or node not in self.nodes or not self._claim(task, node):
            self.dropped += 1
            return
        if obj.get("closing") is True:
            error = obj.get("error")
            self.closed[node] = printable(str(error), 300) if error else None
            return
        dump = rank_dump(obj, node)
        if dump is None or dump.rank in self.dumps or self.per_node.get(node, 0) >= MAX_PER_NODE:
            self.dropped += 1
            return
        self.per_node[node] = self.per_node.get(node, 0) + 1
        self.dumps[dump.rank] = dump

    def _claim(self, task: int, node: str) -> bool:
        """A task speaks for one node, and a node is spoken for by one task."""
        owner = self.task_node.get(task)
        if owner is None and node not in self.claimed:
            self.task_node[task], owner = node, node
            self.claimed.add(node)
        return owner == node


def _object(text: bytes) -> dict[str, object] | None:
    if len(text) > MAX_LINE:
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def parse_capture(out: bytes, nodes: Sequence[str], took_s: float, failure: str | None = None) -> Capture:
    """The step's labelled output (``TASK: LINE``) as a capture of ``nodes``; a node without its
    agent's closing line is missing (``failure``, else "no answer before the deadline")."""
    parse = _Parse(frozenset(nodes))
    for raw in out[:MAX_OUTPUT].split(b"\n"):
        m = _LABEL.match(raw.rstrip(b"\r"))
        if m is None:
            parse.dropped += 1 if raw.strip() else 0
            continue
        parse.line(int(m[1]), m[2])
    missing = {n: why for n, why in parse.closed.items() if why is not None}
    silent = failure or "no answer before the deadline"
    missing |= {n: silent for n in nodes if n not in parse.closed}
    dumps = tuple(sorted(parse.dumps.values(), key=lambda d: d.rank))
    return Capture(dumps, missing, took_s, failure, parse.dropped)


class SrunStackCapture:
    """The runner: the step, bounded by ``deadline_s``; never raises."""

    def __init__(self, settings: CaptureSettings = CaptureSettings(), env: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self._env = dict(env) if env is not None else None

    def capture(self, job_id: int, nodes: Sequence[str]) -> Capture:
        began = time.monotonic()
        argv = capture_argv(self.settings, job_id, nodes)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self._env)  # fmt: skip
        except OSError as exc:
            why = f"{argv[0]}: {exc.strerror}"
            return parse_capture(b"", nodes, time.monotonic() - began, why)
        out, err = _Bounded(proc.stdout, MAX_OUTPUT), _Bounded(proc.stderr, 64 << 10)
        failure = self._wait(proc, began)
        out.join(self.settings.stop_grace_s)
        err.join(self.settings.stop_grace_s)
        if failure is None and proc.returncode:
            failure = f"the capture step failed (exit {proc.returncode}): {printable(err.text(), 300)}"
        took = time.monotonic() - began
        capture = parse_capture(out.data(), nodes, took, failure)
        log.info("stacks_captured", job=job_id, ranks=len(capture.dumps), missing=len(capture.missing), took_s=round(took, 2))  # fmt: skip
        return capture

    def _wait(self, proc: subprocess.Popen[bytes], began: float) -> str | None:
        left = max(0.1, self.settings.deadline_s - (time.monotonic() - began))
        try:
            proc.wait(left)
            return None
        except subprocess.TimeoutExpired:
            proc.terminate()  # srun passes it to the tasks
            try:
                proc.wait(self.settings.stop_grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return f"no answer within the {self.settings.deadline_s:g} s deadline"


class _Bounded:
    """Reads a pipe to its end on a thread of its own, keeping the first ``limit`` bytes."""

    def __init__(self, pipe: IO[bytes] | None, limit: int) -> None:
        self._chunks: list[bytes] = []
        self._kept, self._limit = 0, limit
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[bytes] | None) -> None:
        if pipe is None:
            return
        with pipe:
            for chunk in iter(lambda: pipe.read(65536), b""):
                if self._kept < self._limit:
                    self._chunks.append(chunk[: self._limit - self._kept])
                    self._kept += len(self._chunks[-1])

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def data(self) -> bytes:
        return b"".join(self._chunks)

    def text(self) -> str:
        return self.data().decode("utf-8", "replace")
