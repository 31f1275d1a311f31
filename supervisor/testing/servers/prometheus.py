"""A private Prometheus for tests: Debian's ``prometheus`` package (2.42 on Debian 12, which brings
``promtool``) started as a child process with its own TSDB directory and a free port on 127.0.0.1.

``LocalPrometheus(workdir, targets, rule_files).start()`` writes a config that scrapes each
``ScrapeTarget`` every ``interval_s`` (with ``authorization: {credentials_file: ...}`` where the target
has a token file, as docs/observability.md tells operators), evaluates the rule files at the same
interval, and waits for ``/-/ready``. ``query``, ``wait_for``, ``targets``, ``rules`` and ``alerts``
read its HTTP API (``/api/v1/...``). ``promtool(...)`` runs the package's ``promtool``.

Prometheus 2.42 cannot listen on port 0 and say which port it took, so a free port is picked first
and the start is tried again on another port when that one was taken meanwhile.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMETHEUS = "prometheus"
PROMTOOL = "promtool"
INSTALL = "apt-get install -y --no-install-recommends prometheus"
PORT_TRIES = 3


class PrometheusError(RuntimeError):
    """Prometheus did not start, or its API answered an error."""


def unavailable_reason() -> str | None:
    """Why a private Prometheus cannot run here, or None."""
    missing = [b for b in (PROMETHEUS, PROMTOOL) if shutil.which(b) is None]
    return f"{', '.join(missing)} not found ({INSTALL})" if missing else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def promtool(*args: str, cwd: Path | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` (never raises on its exit status: callers assert on it with its output)."""
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


@dataclass(frozen=True)
class ScrapeTarget:
    job: str
    addresses: tuple[str, ...]  # host:port each
    credentials_file: Path | None = None  # sent as "Authorization: Bearer <file's content>"


class LocalPrometheus:
    """One Prometheus process over ``workdir`` (config, TSDB, log)."""

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[ScrapeTarget],
        rule_files: Sequence[Path] = (),
        *,
        interval_s: float = 1.0,
    ) -> None:
        self.workdir = Path(workdir)
        self.targets_config, self.rule_files, self.interval_s = list(targets), list(rule_files), interval_s
        self.config = self.workdir / "prometheus.yml"
        self.log_path = self.workdir / "prometheus.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ------------------------------------------------------------------ start, stop
    def start(self, timeout: float = 60.0) -> LocalPrometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text(json.dumps(self._config(), indent=2))  # JSON is YAML
        for _ in range(PORT_TRIES):
            self.port = free_port()
            if self._started(timeout):
                return self
            if "address already in use" not in self._log_tail().lower():
                break
        raise PrometheusError(f"prometheus did not start:\n{self._log_tail()}")

    def _config(self) -> dict[str, Any]:
        every = f"{int(self.interval_s * 1000)}ms"
        return {
            "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
            "rule_files": [str(Path(f).resolve()) for f in self.rule_files],
            "scrape_configs": [_scrape_config(t) for t in self.targets_config],
        }

    def _started(self, timeout: float) -> bool:
        tsdb = self.workdir / f"tsdb-{self.port}"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={tsdb}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            if self._ready():
                return True
            time.sleep(0.1)
        self.stop()
        raise PrometheusError(f"prometheus not ready within {timeout} s:\n{self._log_tail()}")

    def _ready(self) -> bool:
        try:
            return self._get("/-/ready")[0] == 200  # 503 while it loads the TSDB
        except OSError:  # refused while it starts
            return False

    def _get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", path)
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def stop(self, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------------ the HTTP API
    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/PATH?params``'s ``data``; PrometheusError on an error answer."""
        status, raw = self._get(f"/api/v1/{path}?{urllib.parse.urlencode(params)}")
        try:  # 400/422 (a bad query) carry Prometheus' reason in the same JSON
            body = json.loads(raw)
        except ValueError:
            raise PrometheusError(f"{path} {params}: HTTP {status}: {raw[:300]!r}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (a vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        data = self.api("query", query=expr)
        return data["result"] if data["resultType"] == "vector" else [data]

    def wait_for(
        self,
        expr: str,
        until: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = 30.0,
    ) -> list[dict[str, Any]]:
        """Query ``expr`` until ``until(result)`` (default: not empty); the result."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if until(result):
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr!r}: not as awaited within {timeout} s; last result {result}")
            time.sleep(0.2)

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]  # type: ignore[no-any-return]

    def rules(self) -> list[dict[str, Any]]:
        return self.api("rules")["groups"]  # type: ignore[no-any-return]

    def alerts(self) -> list[dict[str, Any]]:
        return self.api("alerts")["alerts"]  # type: ignore[no-any-return]


def _scrape_config(target: ScrapeTarget) -> dict[str, Any]:
    config: dict[str, Any] = {"job_name": target.job, "static_configs": [{"targets": list(target.addresses)}]}
    if target.credentials_file is not None:
        config["authorization"] = {"type": "Bearer", "credentials_file": str(target.credentials_file)}
    return config
