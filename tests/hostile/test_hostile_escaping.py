"""Hostile strings at every exit (issue 17, item 6; security review finding #11).

An agent's strings (a PCI bus id, an NVML error) and a job's log lines end up in finding reasons
and logbook text. ESC/OSC sequences must never reach Slurm's drain reason or the terminal; raw
HTML, links and headings must not appear in the Markdown chronicle; ``<!channel>`` must not ping
Slack. The ingest refuses control characters and odd identifiers outright (first line); every exit
cleans or escapes what it prints (second line). Each test failed on the code before the fix."""

from __future__ import annotations

import io
import json
import time

import pytest
from click.testing import CliRunner
from markdown_it import MarkdownIt
from rich.console import Console

from supervisor.adapters.paging.webhook import Alert, payload
from supervisor.adapters.slurm.cli import node_state_argv
from supervisor.adapters.sqlite import SqliteStore
from supervisor.adapters.web.ingest import ReportIngest, Request
from supervisor.cli import main
from supervisor.cli.views import render
from supervisor.domain.cluster import NodeChange
from supervisor.domain.health.gpu_health import HealthRules
from supervisor.domain.health.node_report import SCHEMA_VERSION, GpuSample, NodeReport, XidEvent, check_batch, to_wire
from supervisor.domain.health.quarantine import Fault
from supervisor.domain.records import AttemptRecord, Event, EventKind, NodeVerdict, RunRecord, Verdict
from supervisor.domain.run import RunSpec, RunState
from supervisor.report.chronicle import render_markdown

OSC_TITLE = "\x1b]0;owned\x1b\\"  # sets the terminal's title
OSC_CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"  # writes the clipboard
CLEAR = "\x1b[2J\x1b[H"
C1 = "\x9b31m\x85"  # CSI and NEL as single C1 code points
HOSTILE = f"GPU 3 {OSC_TITLE}{OSC_CLIPBOARD}{CLEAR}{C1}fell off\rthe bus\x00"
CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]
T0 = 1_795_910_400.0


def no_controls(text: str) -> bool:
    return not any(c in text for c in CONTROLS)


# ---------------------------------------------------------------- the ingest: the first line


def _post(node_kw: dict[str, object] | None = None, **report_kw: object) -> tuple[int, str]:
    gpu = GpuSample(i=0, **(node_kw or {}))  # type: ignore[arg-type]
    report = NodeReport(v=SCHEMA_VERSION, node="n001", seq=1, at=T0, gpus=(gpu,), **report_kw)  # type: ignore[arg-type]
    data = json.dumps({"v": 1, "node": "n001", "reports": [to_wire(report)]}).encode()
    ingest = ReportIngest({"r": "token-0123456789"}, HealthRules(), type("C", (), {"now": lambda self: T0})())
    ingest.publish_job_nodes({"r": frozenset({"n001"})})
    answer = ingest.handle(Request("POST", "/v1/reports/r", "", {"authorization": "Bearer token-0123456789"}, data, ""))
    return answer.status, answer.body.decode()


@pytest.mark.parametrize(
    ("gpu", "report", "field"),
    [
        ({"bus": f"00000000:19:00.0{OSC_TITLE}"}, {}, "bus"),
        ({"uuid": "GPU-1234 <b>"}, {}, "uuid"),
        ({"errors": {f"temp{CLEAR}": "Timeout"}}, {}, "errors"),
        ({"errors": {"temp": f"Timeout{OSC_CLIPBOARD}"}}, {}, "errors"),
        ({"name": f"NVIDIA H100{C1}"}, {}, "name"),
        ({}, {"errors": (HOSTILE,)}, "errors"),
        ({}, {"driver": "535.104.05;rm -rf"}, "driver"),
        ({}, {"xids": (XidEvent(gpu=-1, xid=79, at=T0, bus=f"0000:19:00.0{OSC_TITLE}"),)}, "bus"),
        ({}, {"xids": (XidEvent(gpu=0, xid=79, at=T0, text=HOSTILE),)}, "text"),
    ],
)
def test_the_ingest_refuses_control_characters_and_odd_identifiers(gpu, report, field):
    status, answer = _post(gpu, **report)
    assert status == 422 and field in answer


def test_honest_identifiers_and_text_pass():
    gpu = {"bus": "00000000:19:00.0", "uuid": "MIG-GPU-5f0e5b7e-1a2b/1/0", "name": "NVIDIA H100 80GB HBM3"}
    xid = XidEvent(gpu=0, xid=79, at=T0, text="NVRM: Xid (PCI:0000:19:00): 79, pid=1234, GPU has fallen off the bus.")
    status, _ = _post({**gpu, "errors": {"power_w": "Not Supported"}}, driver="535.104.05", xids=(xid,))
    assert status == 200


def test_check_batch_names_the_field():
    from supervisor.domain.health.node_report import ReportBatch

    bad = NodeReport(v=SCHEMA_VERSION, node="n1", seq=1, at=T0, gpus=(GpuSample(i=2, bus=f"x{CLEAR}"),))
    assert "gpu 2: bus" in (check_batch(ReportBatch(v=1, node="n1", reports=(bad,))) or "")


# ---------------------------------------------------------------- Slurm's drain reason


def test_no_control_character_reaches_slurms_drain_reason():
    argv = node_state_argv("n003", NodeChange.DRAIN, f"slurm-supervisor: run bob: XID 79 ({HOSTILE})")
    reason = argv[-1]
    assert reason.startswith("reason=slurm-supervisor: run bob: XID 79 (GPU 3 ")
    assert no_controls(reason) and "owned" in reason  # the words stay, their power does not


# ---------------------------------------------------------------- the terminal


def _event(message: str = HOSTILE, **evidence: object) -> Event:
    return Event("bob", EventKind.FAULT, message, "k1", T0, 0, 1001, f"sup{CLEAR}", evidence or {"node": "n003"})


def test_logbook_lines_for_the_terminal_carry_no_controls():
    console = Console(record=True, force_terminal=True, color_system=None, width=400, file=io.StringIO())
    render.print_events(console, [_event(last_lines=[HOSTILE])], render.EventFilter(), evidence=True)
    shown = console.export_text(styles=False)
    assert "fell off" in shown and no_controls(shown.replace("\n", ""))
    for line in render.logbook_lines([_event()], evidence=True):
        assert no_controls(line)


def test_node_and_status_lines_carry_no_controls():
    verdict = NodeVerdict("n003", Verdict.BAD, HOSTILE, run="bob", at=T0)
    assert all(no_controls(line) for line in render.node_lines([verdict]))


def test_the_cli_prints_no_controls(tmp_path):
    store = SqliteStore(tmp_path)
    store.set_verdict(NodeVerdict("n003", Verdict.BAD, HOSTILE, run="bob", at=time.time()))
    for i in range(3):
        store.record_node_fault(Fault("n003", time.time() - i, "bob", HOSTILE, key=f"f{i}"))
    env = {"SLURM_SUPERVISOR_STATE_DIR": str(tmp_path)}
    for args in (["nodes"], ["quarantine", "list"]):
        out = CliRunner().invoke(main, args, env=env, catch_exceptions=False).output
        assert "fell off" in out and no_controls(out.replace("\n", "")), args


# ---------------------------------------------------------------- the Markdown chronicle

INJECTED = [
    '<img src=x onerror="alert(1)">',
    "<script>alert(2)</script>",
    "[click here](https://evil.example/login)",
    "![pixel](https://evil.example/track.png)",
    "<https://evil.example/autolink>",
    "\n# Injected heading\n",
    "\n\n---\n## Another\n",
    "| fake | table |",
    "&lt;img src=x&gt;",
    "`code` **bold**",
]


def _chronicle() -> str:
    spec = RunSpec(name="bob", script="/t.sbatch", partition="main", nodes=2, max_restarts=5)
    run = RunRecord(spec, RunState.RUNNING, created_at=T0, end_reason=" ".join(INJECTED), excluded={"n003": HOSTILE})
    ended = {"started_at": T0 + 1, "ended_at": T0 + 50, "end_state": "FAILED", "end_reason": " ".join(INJECTED)}
    attempts = [
        AttemptRecord("bob", 0, 1001, 0, T0, ("n003",), **ended),
        AttemptRecord("bob", 1, 1002, 0, T0 + 60, ("n004",), started_at=T0 + 61),
    ]
    hang = {"last_step": 7, "silent_s": 900.0, "log": "/o`ut<b>.log", "last_lines": INJECTED}
    events = [
        Event(
            "bob", EventKind.FAULT, " ".join(INJECTED), "f", T0 + 50, 0, 1001, "sup", {"node": "n003", "x": INJECTED}
        ),
        Event("bob", EventKind.FAULT, "hang", "h:hang", T0 + 51, 0, 1001, "sup", hang),
        Event("bob", EventKind.WARNING, " ".join(INJECTED), "w", T0 + 52, 0, 1001, "sup", {}),
        Event("bob", EventKind.STARTED, "started", "s", T0 + 61, 1, 1002, "sup", {}),
        Event("bob", EventKind.NOTE, "\n".join(INJECTED), "n", T0 + 70, 1, 1002, "<b>mallory</b>", {}),
        Event("bob", EventKind.CHECKPOINT_VERIFIED, HOSTILE, "c", T0 + 80, 1, 1002, "sup", {}),
    ]
    return render_markdown(run, attempts, events)


def test_the_chronicle_injects_no_html_links_or_headings():
    text = _chronicle()
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    kinds = {t.type for t in tokens} | {c.type for t in tokens for c in t.children or ()}
    assert not kinds & {"html_block", "html_inline", "link_open", "image", "hr"}, kinds
    headings = [t for t in tokens if t.type == "heading_open"]
    own = [line for line in text.splitlines() if line.startswith("#")]
    assert len(headings) == len(own) and not any("Injected" in h or "Another" in h for h in own)
    own_rows = [line for line in text.splitlines() if line.startswith("| ")]
    rows = [t for t in tokens if t.type == "tr_open"]
    assert len(rows) == len(own_rows)  # the chronicle's own tables only, each row whole
    assert "| 0 | 1001 | 0 | 1 |" in text  # the attempts table's row with the injected end reason
    assert no_controls(text.replace("\n", ""))
    html = MarkdownIt("commonmark").enable("table").render(text)
    assert "<img" not in html and "<script" not in html and "onerror=" not in html.replace("onerror=&quot;", "")


def test_the_chronicle_still_reads_as_the_words_it_was_given():
    text = _chronicle()
    html = MarkdownIt("commonmark").enable("table").render(text)
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html and "[click here](https://evil.example/login)" in html


# ---------------------------------------------------------------- Slack and other webhooks


def test_slack_text_cannot_ping_or_link():
    summary = f"run bob gave up: <!channel> <!here> <@U123> <https://evil.example|click> & {HOSTILE}"
    alert = Alert("bob:gave_up", "trigger", "bob", "gave_up", summary, T0, {"message": HOSTILE})
    body = payload(alert, "slack")
    texts = [body["text"], body["blocks"][0]["text"]["text"], body["blocks"][1]["elements"][0]["text"]]
    for text in texts:
        assert "<" not in text and ">" not in text and no_controls(text)
    assert "&lt;!channel&gt;" in texts[0] and "&amp; GPU 3" in texts[0]


def test_no_control_character_reaches_a_webhook():
    alert = Alert(
        "bob:gave_up", "trigger", "bob", "gave_up", HOSTILE, T0, {"message": HOSTILE, "evidence": {"x": [HOSTILE]}}
    )
    for fmt in ("slack", "pagerduty"):
        body = payload(alert, fmt, routing_key="k")
        assert all(no_controls(text) for text in _strings(body)), fmt


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def test_the_html_page_shows_the_escaped_chronicle_as_the_words_given():
    from supervisor.adapters.logbook_html.markdown import markdown_to_html

    html = markdown_to_html(_chronicle())
    assert "<img" not in html and "<script" not in html and "<a " not in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html and "[click here](https://evil.example/login)" in html
    assert "\\&lt;" not in html and "\\[" not in html  # Markdown's escapes do not show
    assert "<td>FAILED (" in html and "| fake | table |" in html  # an escaped pipe splits no cell


@pytest.mark.slurm
def test_a_real_slurm_drain_reason_carries_no_control_character(slurm_cluster):
    from supervisor.adapters.slurm.cli import SlurmCli

    cli = SlurmCli(slurm_conf=str(slurm_cluster.slurm_conf), env=slurm_cluster.env, timeout=20.0)
    cli.set_node_state("n4", NodeChange.DRAIN, f"slurm-supervisor: run bob: XID 79 ({HOSTILE})")
    try:
        reason = cli.snapshot().nodes["n4"].reason
        assert "XID 79" in reason and "owned" in reason and no_controls(reason), repr(reason)
    finally:
        cli.set_node_state("n4", NodeChange.RESUME, "")
