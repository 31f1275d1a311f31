"""The agent loop: sample every ``interval_s``, wait on XID events in between, send reports.

Two threads. The *reader* thread owns NVML: it opens it (retrying every interval while the driver
is unavailable), samples every GPU, then waits on the XID event set in slices of ``xid_poll_s``
until the next sample is due; each XID is handed over at once. The *main* thread builds the
reports and sends them: one per sample, one as soon as an XID arrives (so an XID reaches the
daemon within a fraction of the interval), and — should the reader be stuck in a wedged driver
call — a heartbeat every interval saying so, without GPUs. NVML errors never end the agent.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from supervisor.domain.health.node_report import SCHEMA_VERSION, GpuSample, HostSample, NodeReport, XidEvent

log = structlog.get_logger(__name__)


class GpuReader(Protocol):
    driver: str
    errors: list[str]

    @property
    def gpu_count(self) -> int: ...

    def open(self) -> None: ...

    def sample(self) -> list[GpuSample]: ...

    def wait_xids(self, timeout_s: float) -> list[XidEvent]: ...

    def close(self) -> None: ...


class ReportSink(Protocol):
    def add(self, report: NodeReport) -> None: ...

    def flush(self, now: float, *, force: bool = False) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class AgentSettings:
    interval_s: float = 5.0
    xid_poll_s: float = 0.25  # longest slice of one event wait (how fast a stop is noticed)

    def __post_init__(self) -> None:
        if not 0.05 <= self.interval_s <= 3600 or not 0.01 <= self.xid_poll_s <= self.interval_s:
            raise ValueError("interval_s must be within 0.05..3600 s and xid_poll_s within 0.01..interval_s")


@dataclass(frozen=True)
class _Sample:
    gpus: tuple[GpuSample, ...]
    gpu_count: int | None
    errors: tuple[str, ...]
    driver: str


class Agent:
    def __init__(
        self,
        node: str,
        reader: GpuReader,
        sink: ReportSink,
        settings: AgentSettings | None = None,
        host: Callable[[], HostSample | None] = lambda: None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.reader = reader
        self.sink = sink
        self.settings = settings or AgentSettings()
        self.host = host
        self.now = now
        self._stop = threading.Event()
        self._queue: queue.Queue[_Sample | list[XidEvent]] = queue.Queue()
        self._seq = 0
        self._last: _Sample | None = None
        self._last_sample_at = time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ reader thread
    def _read_loop(self) -> None:
        interval = self.settings.interval_s
        while not self._stop.is_set():
            try:
                self.reader.open()
                break
            except Exception as exc:  # noqa: BLE001 - NvmlUnavailable or a broken library: report, retry
                self._queue.put(_Sample((), None, (str(exc)[:250],), ""))
                if self._stop.wait(interval):
                    return
        try:
            while not self._stop.is_set():
                due = time.monotonic() + interval
                gpus = tuple(self.reader.sample())
                self._queue.put(
                    _Sample(gpus, self.reader.gpu_count, tuple(self.reader.errors[-8:]), self.reader.driver)
                )
                while not self._stop.is_set() and (left := due - time.monotonic()) > 0:
                    xids = self.reader.wait_xids(min(left, self.settings.xid_poll_s))
                    if xids:
                        self._queue.put(xids)
        finally:
            self.reader.close()

    # ------------------------------------------------------------------ main thread
    def run(self) -> None:
        """Until ``stop()``: the reader thread samples, this thread reports."""
        reader = threading.Thread(target=self._read_loop, name="nvml-reader", daemon=True)
        reader.start()
        interval = self.settings.interval_s
        next_beat = time.monotonic() + interval
        log.info("agent_started", node=self.node, interval_s=interval)
        try:
            while not self._stop.is_set():
                try:
                    item = self._queue.get(timeout=max(0.0, min(next_beat - time.monotonic(), 0.5)))
                except queue.Empty:
                    item = None
                if isinstance(item, _Sample):
                    self._last, self._last_sample_at = item, time.monotonic()
                    self._emit(item, ())
                    next_beat = time.monotonic() + interval
                elif isinstance(item, list):
                    self._emit(self._last, tuple(item), force=True)
                elif time.monotonic() >= next_beat:
                    self._heartbeat()
                    next_beat = time.monotonic() + interval
                else:
                    self.sink.flush(self.now())  # retry what is buffered, when the backoff allows
        finally:
            self._stop.set()
            reader.join(timeout=2 * interval + 1)
            self.sink.flush(self.now(), force=True)
            self.sink.close()
            log.info("agent_stopped", node=self.node)

    def _heartbeat(self) -> None:
        silent = time.monotonic() - self._last_sample_at
        note = f"no GPU sample for {silent:.0f} s: NVML is not answering"
        self._emit(_Sample((), None, (note,), self._last.driver if self._last else ""), ())

    def _emit(self, sample: _Sample | None, xids: tuple[XidEvent, ...], *, force: bool = False) -> None:
        self._seq += 1
        s = sample or _Sample((), None, (), "")
        report = NodeReport(
            v=SCHEMA_VERSION,
            node=self.node,
            seq=self._seq,
            at=self.now(),
            interval_s=self.settings.interval_s,
            gpu_count=s.gpu_count,
            gpus=s.gpus,
            xids=xids,
            host=self.host(),
            errors=s.errors,
            driver=s.driver,
        )
        for x in xids:
            log.warning("agent_xid", node=self.node, gpu=x.gpu, xid=x.xid)
        self.sink.add(report)
        self.sink.flush(self.now(), force=force)
