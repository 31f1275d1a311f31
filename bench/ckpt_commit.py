"""The trainer's commit cost on a POSIX root, and discovery of a large listing.

1. ``build_manifest`` on a checkpoint of SHARDS files of SHARD_MIB each (in the page cache, as
   right after a save), with 1 and with ``--workers`` threads, against a plain sequential read of
   the same bytes in the same run (the floor any checksumming commit must pay on POSIX, which
   keeps no checksums). Goal: the parallel manifest at >= 0.8x the plain read's throughput.
2. ``discover`` (pure) on a listing of 10,000 shards spread over 10 checkpoints, plus one in each
   adopted layout: milliseconds per call.

    .venv/bin/python bench/ckpt_commit.py [--shards 32] [--shard-mib 8] [--workers 4] [--dir DIR]

Last line: one JSON object (``manifest_vs_read``, ``manifest_gbps``, ``read_gbps``,
``manifest_1w_gbps``, ``discover_10k_ms``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from supervisor.adapters.checkpoints.commit import build_manifest
from supervisor.adapters.checkpoints.posix import PosixBackend
from supervisor.domain.checkpoints.layouts import discover
from supervisor.domain.checkpoints.manifest import ObjectInfo


def write_shards(root: Path, shards: int, mib: int) -> int:
    block = os.urandom(1 << 20)
    for i in range(shards):
        path = root / "step_000100" / f"rank{i:04d}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(block)
    return shards * mib << 20


def plain_read(root: Path) -> int:
    n = 0
    for path in sorted((root / "step_000100").iterdir()):
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(1 << 20):
                n += len(chunk)
    return n


def best_of(fn, repeat: int = 3) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def listing_10k() -> list[ObjectInfo]:
    objs = [
        ObjectInfo(f"run/ckpt/step_{s:06d}/model/rank{r:05d}.pt", 1 << 20, modified_at=float(s))
        for s in range(10)
        for r in range(1000)
    ]
    objs += [ObjectInfo(f"run/ckpt/step_{s:06d}/ssv-manifest.json", 100, modified_at=float(s) + 0.5) for s in range(9)]
    objs += [
        ObjectInfo("dcp/step_5/.metadata", 1),
        ObjectInfo("dcp/step_5/__0_0.distcp", 1),
        ObjectInfo("meg/latest_checkpointed_iteration.txt", 2, modified_at=9.0),
        ObjectInfo("meg/iter_0000100/mp_rank_00/model_optim_rng.pt", 1, modified_at=1.0),
        ObjectInfo("nemo/m--step=7-last/weights/.metadata", 1),
    ]
    return objs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=32)
    ap.add_argument("--shard-mib", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temporary dir)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ssv-bench-commit-", dir=args.dir))
    try:
        total = write_shards(tmp, args.shards, args.shard_mib)
        backend = PosixBackend(str(tmp))
        plain_read(tmp)  # warm the page cache
        t_read = best_of(lambda: plain_read(tmp))
        t_one = best_of(lambda: build_manifest(backend, "step_000100", 100, workers=1))
        t_par = best_of(lambda: build_manifest(backend, "step_000100", 100, workers=args.workers))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    listing = listing_10k()
    t_disc = best_of(lambda: discover(listing, lambda p: "s3://b/" + p), repeat=5)
    refs = discover(listing, lambda p: "s3://b/" + p)

    gb = total / 1e9
    rows = [
        ("plain sequential read", t_read),
        ("build_manifest, 1 worker", t_one),
        (f"build_manifest, {args.workers} workers", t_par),
    ]
    print(
        f"checkpoint: {args.shards} shards x {args.shard_mib} MiB = {gb:.2f} GB (page cache), CRC64NVME, "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{'what':<32} {'seconds':>8} {'GB/s':>7}")
    for what, t in rows:
        print(f"{what:<32} {t:>8.3f} {gb / t:>7.2f}")
    print(f"discover: {len(listing)} objects -> {len(refs)} checkpoints in {t_disc * 1000:.1f} ms")
    summary = {
        "manifest_vs_read": round(t_read / t_par, 3),
        "manifest_gbps": round(gb / t_par, 3),
        "read_gbps": round(gb / t_read, 3),
        "manifest_1w_gbps": round(gb / t_one, 3),
        "discover_10k_ms": round(t_disc * 1000, 1),
        "checkpoints_found": len(refs),
        "goal": 0.8,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
