"""Captures kept under the state directory (adapters/stack_files.py): bounded per rank and per
file, the newest kept per run, the daemon's own files."""

from __future__ import annotations

import json
import os

from supervisor.adapters.stack_files import StackFileLimits, StackFiles
from supervisor.domain.stacks.dumps import Capture, rank_dump
from supervisor.domain.stacks.verdict import judge


def dump(rank: int, threads: int = 1, frames: int = 3):
    frame = {"name": "f" * 150, "filename": "torch/distributed/distributed_c10d.py", "line": 1}
    raw = [
        {"thread_name": f"t{i}", "os_thread_id": 9 if i == 0 else i + 100, "frames": [frame] * frames}
        for i in range(threads)
    ]
    made = rank_dump({"rank": rank, "pid": 9, "threads": raw}, "n1")
    assert made is not None
    return made


def keep(files: StackFiles, name: str, *dumps) -> dict:
    capture = Capture(tuple(dumps), {}, 1.0)
    path = files.keep("gpt/../x", name, capture, judge(capture.dumps, ["n1"], {}))
    assert path is not None and os.path.dirname(path).endswith("/gpt_.._x")
    assert os.stat(path).st_mode & 0o777 == 0o600
    return json.loads(open(path).read())


def test_a_big_rank_keeps_its_main_thread_then_fewer_frames(tmp_path):
    files = StackFiles(tmp_path, StackFileLimits(per_rank_bytes=4096))
    doc = keep(files, "a", dump(0, threads=16, frames=48))
    (one,) = doc["dumps"]
    assert one["cut"] and len(one["threads"]) == 1 and one["threads"][0]["main"]
    assert 0 < len(one["threads"][0]["frames"]) < 48 and len(json.dumps(one)) <= 4096 + 20


def test_a_big_capture_leaves_ranks_out_and_counts_them(tmp_path):
    files = StackFiles(tmp_path, StackFileLimits(total_bytes=20_000))
    doc = keep(files, "a", *(dump(r) for r in range(100)))
    assert 0 < len(doc["dumps"]) < 100 and doc["left_out"] == 100 - len(doc["dumps"])
    assert len(json.dumps(doc)) <= 20_000 + 100


def test_only_the_newest_captures_are_kept(tmp_path):
    files = StackFiles(tmp_path, StackFileLimits(keep=2))
    for i in range(4):
        keep(files, f"c{i}", dump(0))
        path = files.folder("gpt/../x") / f"c{i}.json"
        os.utime(path, (1000 + i, 1000 + i))
    assert [p.stem for p in files.listed("gpt/../x")] == ["c3", "c2"]
