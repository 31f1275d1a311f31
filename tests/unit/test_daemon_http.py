"""The daemon's HTTP endpoint as the daemon wires it: run tokens from the store (an ended run's
telemetry is refused), the site hook token, /metrics and the HTML logbook page."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_ingest import body, report

from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.web.ingest import IngestServer, ReportIngest
from supervisor.adapters.web.pages import mount_pages
from supervisor.adapters.web.renderer import ThreadRenderer
from supervisor.adapters.web.tokens import HOOKS, TokenBook
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.domain.run import RunState
from supervisor.testing.kit.clock import ManualClock
from supervisor.testing.kit.specs import spec

SPEC = spec(script="/x.sbatch", partition="gpu")
READ_TOKEN = "read-token-0123456789abcdef"


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[IngestServer, SqliteStore, Path]]:
    store = SqliteStore(tmp_path)
    store.add_run(SPEC, time.time())
    hook_file = tmp_path / "hook.token"
    hook_file.write_text("site-hook-token-0123456789\n")
    hook_file.chmod(0o600)  # a secret: read like the others (owner only)
    reader = SqliteStore(tmp_path)  # the ingest thread's own connection, as in the daemon
    book = TokenBook(reader.active_tokens, hook_token_file=str(hook_file), refresh_s=0.0)
    feed = ReportIngest(book, HealthRules(), ManualClock())
    feed.publish_job_nodes({"llm": frozenset({"gpu001", "gpu002"})})  # the run's job, as the engine says
    server = IngestServer(feed, port=0)
    mount_pages(server, ThreadRenderer(SqliteStore(tmp_path)), READ_TOKEN)  # the pages' own connection
    server.start()
    yield server, store, hook_file
    server.stop()


def request(
    server: IngestServer, method: str, path: str, data: bytes = b"", token: str | None = None
) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    conn.request(method, path, body=data or None, headers=headers)
    response = conn.getresponse()
    out = response.status, response.getheader("Content-Type") or "", response.read()
    conn.close()
    return out


def test_a_runs_token_is_made_once_and_accepted_until_the_run_ends(world) -> None:
    server, store, _ = world
    token = store.run_token("llm")
    assert token == store.run_token("llm") and len(token) >= 40
    assert request(server, "POST", "/v1/reports/llm", body(), token)[0] == 200
    assert request(server, "POST", "/v1/reports/llm", body(), "guessed-token-0000000000")[0] == 403
    store.set_state("llm", RunState.CANCELLED, time.time(), "done")
    assert request(server, "POST", "/v1/reports/llm", body(node="gpu002"), token)[0] in (403, 404)


def test_hooks_report_with_the_site_token_under_their_pseudo_run(world) -> None:
    server, store, hook_file = world
    hook = body(report(source="healthcheck"))
    assert request(server, "POST", f"/v1/reports/{HOOKS}", hook, "site-hook-token-0123456789")[0] == 200
    assert request(server, "POST", f"/v1/reports/{HOOKS}", body(node="gpu003"), store.run_token("llm"))[0] == 403
    hook_file.unlink()  # no hook token configured: hook reports are refused
    assert request(server, "POST", f"/v1/reports/{HOOKS}", body(node="gpu004"), "site-hook-token-0123456789")[0] in (
        403,
        404,
    )


def test_metrics_and_the_logbook_page_are_served_read_only(world) -> None:
    server, _, _ = world
    status, ctype, text = request(server, "GET", "/metrics", token=READ_TOKEN)
    assert status == 200 and ctype.startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(text.decode())}
    assert any(n.endswith("runs") for n in names), names
    status, ctype, page = request(server, "GET", "/runs/llm/logbook", token=READ_TOKEN)
    assert status == 200 and ctype.startswith("text/html") and b"llm" in page
    assert request(server, "GET", "/runs/nope/logbook", token=READ_TOKEN)[0] == 404
    assert request(server, "POST", "/metrics", b"x", token=READ_TOKEN)[0] == 405
    assert request(server, "GET", "/metrics")[0] == 401  # no read token: nothing (tests/hostile)


def test_the_daemons_pager_posts_a_page_worthy_event_once(tmp_path: Path) -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from supervisor.cli import wiring
    from supervisor.config import load_daemon_config
    from supervisor.domain.records import Event, EventKind

    received: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url_file = tmp_path / "webhook.url"
    url_file.write_text(f"http://127.0.0.1:{httpd.server_port}/hook\n")
    url_file.chmod(0o600)
    config = tmp_path / "supervisor.toml"
    config.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\n[notify]\nwebhook_url_file = "{url_file}"\n')
    cfg = load_daemon_config(config)
    store = wiring.store(cfg)
    store.add_run(SPEC, time.time())
    clock = wiring.clock()
    paging = wiring.pager(cfg, store, clock)
    assert paging is not None
    notifier, after_tick = paging
    try:
        after_tick()
        store.record_event(Event("llm", EventKind.GAVE_UP, "restart budget spent", "k1", time.time() + 1))
        after_tick()
        after_tick()  # the same incident pages once
        assert notifier.flush() == 1  # delivered in this thread: no background thread, no waiting
    finally:
        notifier.close()
        httpd.shutdown()
    assert len(received) == 1 and "restart budget spent" in json.dumps(received[0])
