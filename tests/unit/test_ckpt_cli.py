"""`slurm-supervisor ckpt commit | list | verify` on POSIX roots in temporary directories: the
happy paths, injected corruption, and clear errors (with their exit statuses) for bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from supervisor.cli import main
from supervisor.domain.checkpoints.manifest import MANIFEST_NAME, Manifest
from supervisor.testing.slurm.privileges import as_nobody, open_path_to


def ssv(*args: str) -> Result:
    return CliRunner().invoke(main, ["ckpt", *args], catch_exceptions=False)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "ckpt"
    for step in (100, 200):
        for rank in range(3):
            shard = r / f"step_{step:06d}" / "model" / f"rank{rank}.pt"
            shard.parent.mkdir(parents=True, exist_ok=True)
            shard.write_bytes(os.urandom(4096 + rank))
    return r


def test_commit_then_commit_again(root: Path) -> None:
    res = ssv("commit", str(root), "step_000100", "--step", "100", "--run", "run42", "--writer", "node7")
    assert res.exit_code == 0, res.output
    assert "committed step 100: 3 shards" in res.output and str(root / "step_000100") in res.output
    manifest = Manifest.from_json((root / "step_000100" / MANIFEST_NAME).read_bytes())
    assert (manifest.step, manifest.run, len(manifest.shards)) == (100, "run42", 3)
    assert {s.writer for s in manifest.shards} == {"node7"}
    res = ssv("commit", f"file://{root}", "step_000100", "--step", "100")
    assert res.exit_code == 1 and "already has ssv-manifest.json" in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--step", "abc"), "'abc' is not a valid integer"),
        (("--step", "-1"), "-1 is not in the range x>=0"),
        ((), "Missing option '--step'"),
        (("--step", "100", "--algorithm", "md5"), "'md5' is not one of"),
    ],
)
def test_commit_usage_errors_exit_64(root: Path, args: tuple[str, ...], message: str) -> None:
    res = ssv("commit", str(root), "step_000100", *args)
    assert res.exit_code == 64 and message in res.output


def test_commit_bad_input(root: Path, tmp_path: Path) -> None:
    cases = [
        (["commit", str(root)], "Missing argument 'NAME'"),
        (["commit", str(tmp_path / "nope"), "step_1", "--step", "1"], "not found"),
        (["commit", str(root / "step_000100" / "model" / "rank0.pt"), "x", "--step", "1"], "is not a directory"),
        (["commit", "gs://bucket/run", "step_1", "--step", "1"], "unknown scheme gs://"),
        (["commit", str(root), "step_000100", "--step", "1", "--endpoint-url", "http://x"], "s3:// roots only"),
        (["commit", str(root), "step_000300", "--step", "300"], "holds no shards"),
        (["commit", str(root), "step_000100", "--step", "101"], "named for step 100"),
        (["commit", str(root), "../etc", "--step", "1"], "without '..'"),
        (["commit", "s3://", "step_1", "--step", "1"], "names no valid bucket"),
    ]
    for args, message in cases:
        res = ssv(*args)
        assert (res.exit_code, message in res.output) == (64, True), (args, res.output)
    assert not (root / "step_000100" / MANIFEST_NAME).exists()


def test_list_shows_committed_torn_and_adopted(root: Path) -> None:
    assert ssv("commit", str(root), "step_000100", "--step", "100").exit_code == 0
    dcp = root / "dcp_step_50"
    dcp.mkdir()
    (dcp / "__0_0.distcp").write_bytes(b"x" * 10)
    (dcp / ".metadata").write_bytes(b"m")
    res = ssv("list", str(root))
    assert res.exit_code == 0, res.output
    lines = [line.split() for line in res.output.splitlines()]
    assert lines[0][:3] == ["STEP", "STATE", "GUARANTEE"]
    assert [(row[0], row[1], row[2]) for row in lines[1:4]] == [
        ("50", "committed", "adopted-dcp"),
        ("100", "committed", "manifest"),
        ("200", "UNCOMMITTED", "manifest"),
    ]
    assert "note: adopted-dcp = adopted PyTorch DCP layout" in res.output
    doc = json.loads(ssv("list", str(root), "--json").stdout)
    assert [(c["step"], c["committed"], c["weak"]) for c in doc["checkpoints"]] == [
        (50, True, True),
        (100, True, False),
        (200, False, False),
    ]


def test_list_empty_root(tmp_path: Path) -> None:
    res = ssv("list", str(tmp_path))
    assert (res.exit_code, res.output.strip()) == (0, f"no checkpoints under {tmp_path}")


def test_verify_catches_corruption_at_the_right_level(root: Path) -> None:
    assert ssv("commit", str(root), "step_000100", "--step", "100").exit_code == 0
    res = ssv("verify", str(root), "step_000100")
    assert res.exit_code == 0 and res.output.startswith("VERIFIED"), res.output
    shard = root / "step_000100" / "model" / "rank1.pt"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01  # a bit flip at rest: same size, invisible to metadata
    shard.write_bytes(bytes(data))
    assert ssv("verify", str(root), "step_000100").exit_code == 0
    res = ssv("verify", str(root), "step_000100", "--level", "full", "--json")
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and doc["exit"] == 1
    (result,) = doc["results"]
    assert (result["outcome"], result["level"]) == ("corrupt", "full")
    assert [(p["key"], p["problem"]) for p in result["problems"]] == [("model/rank1.pt", "checksum")]
    shard.write_bytes(bytes(data[:1000]))  # truncated: metadata sees it
    res = ssv("verify", str(root), "step_000100")
    assert res.exit_code == 1 and "CORRUPT" in res.output and "model/rank1.pt: size" in res.output


def test_verify_every_committed_checkpoint_and_skip_torn_ones(root: Path) -> None:
    assert ssv("commit", str(root), "step_000100", "--step", "100").exit_code == 0
    res = ssv("verify", str(root))
    assert res.exit_code == 0, res.output
    assert "VERIFIED" in res.output and "SKIPPED      step 200" in res.output
    (root / "step_000100" / "model" / "rank2.pt").unlink()
    res = ssv("verify", str(root), "--json")
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and [r["outcome"] for r in doc["results"]] == ["corrupt"]
    assert [s["step"] for s in doc["skipped_uncommitted"]] == [200]


def test_verify_a_torn_checkpoint_by_name_is_not_verified(root: Path) -> None:
    res = ssv("verify", str(root), "step_000200")
    assert res.exit_code in (1, 2) and "VERIFIED" not in res.output, res.output


def test_verify_unreadable_shard_is_unverifiable_not_corrupt(root: Path, tmp_path: Path) -> None:
    assert ssv("commit", str(root), "step_000100", "--step", "100").exit_code == 0
    open_path_to(tmp_path)
    shard = root / "step_000100" / "model" / "rank0.pt"
    shard.chmod(0)  # the storage answers, but refuses to hand over the bytes: EACCES
    with as_nobody():
        meta = ssv("verify", str(root), "step_000100")
        full = ssv("verify", str(root), "step_000100", "--level", "full")
    assert meta.exit_code == 0, meta.output  # stat needs no read permission: sizes match
    assert full.exit_code == 2 and "UNVERIFIABLE" in full.stdout and "CORRUPT" not in full.stdout, full.output


def test_verify_nothing_and_unknown_name(root: Path, tmp_path: Path) -> None:
    res = ssv("verify", str(tmp_path))
    assert res.exit_code == 3 and "no committed checkpoint" in res.output
    res = ssv("verify", str(root), "step_000999")
    assert res.exit_code == 64 and "no checkpoint named 'step_000999'" in res.output
    res = ssv("verify", str(root), "--level", "deep")
    assert res.exit_code == 64 and "'deep' is not one of" in res.output
