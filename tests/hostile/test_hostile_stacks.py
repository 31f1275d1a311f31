"""Hostile stacks (issue 35): a job's processes name their functions and files; a node's agent
writes the capture's lines. Control characters are escaped and sizes bounded in every view."""

from __future__ import annotations

import json

from supervisor.adapters.slurm.stack_capture import MAX_LINE, MAX_OUTPUT, parse_capture
from supervisor.domain.stacks.dumps import MAX_FILE, MAX_FRAMES, MAX_NAME, MAX_THREADS, rank_dump
from supervisor.domain.stacks.verdict import judge

EVIL = "load_batch\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\u202e\n# heading <script>alert(1)</script>"
C10D = "torch/distributed/distributed_c10d.py"


def threads(name: str, file: str, n_threads: int = 1, n_frames: int = 1) -> list[dict[str, object]]:
    frame = {"name": name, "filename": file, "line": 1}
    return [{"thread_name": name, "os_thread_id": 5, "frames": [frame] * n_frames} for _ in range(n_threads)]


def test_control_characters_in_function_and_file_names_are_escaped():
    dump = rank_dump({"rank": 1, "pid": 5, "threads": threads(EVIL, "/x/\x1b[31mtrain.py\r\n")}, "n2")
    assert dump is not None
    frame = dump.main_frames[0]
    for text in (frame.function, frame.file, dump.threads[0].name):
        assert all(c.isprintable() for c in text), repr(text)
        assert "\x1b" not in text and "\u202e" not in text and "\n" not in text
    ok = rank_dump({"rank": 0, "pid": 6, "threads": threads("all_reduce", C10D)}, "n1")
    assert ok is not None
    verdict = judge([ok, dump], ["n1", "n2"], {"n3\x1b[2J": "why\x07\n"})
    text = json.dumps(verdict.evidence(), ensure_ascii=False)
    assert "\\u001b" not in text and "\\n" not in text and "\\u0007" not in text and "\u202e" not in text


def test_huge_names_and_stacks_are_cut_to_their_bounds():
    raw = {"rank": 0, "pid": 5, "threads": threads("f" * 5_000_000, "d/" * 1_000_000, n_threads=500, n_frames=5000)}
    dump = rank_dump(raw, "n1")
    assert dump is not None
    assert len(dump.threads) == MAX_THREADS and all(len(t.frames) == MAX_FRAMES for t in dump.threads)
    frame = dump.main_frames[0]
    assert len(frame.function) == MAX_NAME and len(frame.file) == MAX_FILE and frame.file.endswith("d/")
    assert len(json.dumps(dump.to_json())) < MAX_LINE  # what the agent prints for it fits a line


def test_a_10_mb_capture_is_bounded():
    big_line = (
        b"0: " + json.dumps({"node": "n1", "rank": 0, "pid": 5, "threads": threads("x" * (10 << 20), "f")}).encode()
    )
    cap = parse_capture(big_line, ["n1"], 1.0)
    assert cap.dumps == () and cap.dropped == 1  # over MAX_LINE: not read at all
    one = json.dumps({"node": "n1", "rank": 0, "pid": 5, "threads": threads("all_reduce", C10D)}).encode()
    flood = b"\n".join(b"0: " + one.replace(b'"rank": 0', f'"rank": {i}'.encode()) for i in range(100_000))
    assert len(flood) > 10 << 20
    cap = parse_capture(flood, ["n1"], 1.0)
    assert len(cap.dumps) == 64  # MAX_PER_NODE
    assert len(flood[:MAX_OUTPUT]) == MAX_OUTPUT


def _hostile_capture() -> tuple[dict[str, object], dict[str, object]]:
    """A capture file's document and a hang's evidence, both with EVIL in the names."""
    from supervisor.adapters.stack_files import StackFileLimits, capture_file_text
    from supervisor.domain.stacks.dumps import Capture
    from supervisor.engine.facts.hang_stacks import additions

    bad = rank_dump({"rank": 1, "pid": 5, "threads": threads(EVIL, "/x/\x1b[31mtrain.py")}, "n2")
    ok = rank_dump({"rank": 0, "pid": 6, "threads": threads("all_reduce", C10D)}, "n1")
    assert bad is not None and ok is not None
    capture = Capture((ok, bad), {"n3": "ptrace refused \x1b[2J"}, 1.0)
    verdict = judge(capture.dumps, ["n1", "n2", "n3"], capture.missing)
    doc = json.loads(capture_file_text("gpt", capture, verdict, StackFileLimits()))
    hang = {"reason": "no new step", "last_step": 3, "silent_s": 9.0, **additions(capture, verdict, "/s/f.json", False)}
    return doc, hang


def test_every_view_of_hostile_stacks_is_escaped():
    from supervisor.cli.views.stacks_view import capture_lines
    from supervisor.domain.records import Event, EventKind
    from supervisor.report.text import evidence, safe_event

    doc, hang = _hostile_capture()
    for line in capture_lines(doc, ranks=True):  # the terminal
        assert line.isprintable() and "\x1b" not in line and "\u202e" not in line, repr(line)
    event = Event("gpt", EventKind.FAULT, "hang: " + str(hang["reason"]), "k", evidence=hang)
    md = evidence(safe_event(event))  # the chronicle (Markdown), which the HTML page renders
    assert "<script>" not in md and "\\<script\\>" in md and "\x1b" not in md and "\n" not in md
    assert "stacks captured in 1 s" in md and "kept in /s/f.json" in md
