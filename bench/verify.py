"""Checkpoint verification speed against plain S3 reads on the same server in the same run (issue 5).

    .venv/bin/python bench/verify.py [--server moto|rgw|both] [--mib 256] [--shards 16] [--trials 3]

(a) **full verification** of a ``--mib`` MiB checkpoint in ``--shards`` shards (every byte streamed,
    CRC64NVME computed and compared with the manifest; shards in parallel) against a **plain
    single-stream GET** of the same bytes stored as one object (``iter_chunks``, bytes discarded, no
    checksum): ``full_vs_get`` = verification throughput / GET throughput (goal >= 0.8). Trials
    alternate GET, verify, GET, verify...; medians.
(b) **metadata verification of a 10,000-shard checkpoint** (manifest, paginated listing, a HEAD
    per shard for its stored checksum on ``--workers`` threads) against a **naive sequential HEAD
    loop** over the same shards (``head_object`` one after the other, sizes compared).

The server is started the way the tests start it (``supervisor.testing.servers.s3servers``: moto as a
subprocess; Ceph RGW from Debian's packages, ~13 s). Prints a table; the last line is one JSON
object: ``full_vs_get``, ``meta_10k_s``, ``naive_meta_10k_s`` (first server), then per server.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import quiet_logs, table  # noqa: E402

from supervisor.adapters.checkpoints.checksums import checksum_of  # noqa: E402
from supervisor.adapters.checkpoints.s3 import S3Backend  # noqa: E402
from supervisor.adapters.checkpoints.store import BackendCheckpointStore  # noqa: E402
from supervisor.domain.checkpoints.manifest import (  # noqa: E402
    MANIFEST_NAME,
    CheckpointRef,
    Guarantee,
    Level,
    Manifest,
    Outcome,
    ShardEntry,
)
from supervisor.testing.servers.s3servers import CephRgw, MotoS3, S3Server  # noqa: E402

MiB = 1 << 20
BUCKET = "ssv-bench"


def upload(server: S3Server, items: list[tuple[str, bytes]], workers: int = 8) -> None:
    """PUT with ChecksumAlgorithm=CRC64NVME, as a careful trainer would: where the server keeps it,
    metadata verification must HEAD every shard to compare it (the slow case)."""
    s3 = server.client(read_timeout=120.0)

    def put(item: tuple[str, bytes]) -> None:
        s3.put_object(Bucket=BUCKET, Key=item[0], Body=item[1], ChecksumAlgorithm="CRC64NVME")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(put, items))


def checkpoint(server: S3Server, name: str, step: int, shards: list[bytes]) -> CheckpointRef:
    entries, items = [], []
    for i, data in enumerate(shards):
        key = f"shard_{i:05d}.bin"
        entries.append(ShardEntry(key, len(data), checksum_of(data)))
        items.append((f"ckpt/{name}/{key}", data))
    upload(server, items)
    manifest = Manifest(step, tuple(entries))
    server.client().put_object(Bucket=BUCKET, Key=f"ckpt/{name}/{MANIFEST_NAME}", Body=manifest.to_json().encode())
    return CheckpointRef(f"s3://{BUCKET}/ckpt/{name}/", name, step, Guarantee.MANIFEST)


def plain_get(s3: Any, key: str, chunk: int) -> int:
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"]
    n = 0
    for part in body.iter_chunks(chunk):
        n += len(part)
    body.close()
    return n


def naive_meta(s3: Any, manifest: Manifest, prefix: str) -> bool:
    ok = True
    for shard in manifest.shards:
        head = s3.head_object(Bucket=BUCKET, Key=prefix + shard.key, ChecksumMode="ENABLED")
        ok &= head["ContentLength"] == shard.size
    return ok


def bench_server(server: S3Server, args: argparse.Namespace) -> dict[str, Any]:
    for name, value in server.credentials_env().items():
        os.environ[name] = value
    server.create_bucket(BUCKET)
    size = args.mib * MiB
    blob = os.urandom(size)
    per = size // args.shards
    big = checkpoint(server, "step_000100", 100, [blob[i * per : (i + 1) * per] for i in range(args.shards)])
    upload(server, [("plain/one-object.bin", blob)], workers=1)
    backend = S3Backend(
        f"s3://{BUCKET}/ckpt/",
        endpoint_url=server.endpoint_url,
        region=server.region,
        max_pool_connections=max(32, args.workers),
    )
    store = BackendCheckpointStore(backend, workers=args.workers, chunk_size=args.chunk_mib * MiB)
    s3 = server.client(read_timeout=120.0)
    gets, fulls = [], []
    for _ in range(args.trials):
        t = time.perf_counter()
        assert plain_get(s3, "plain/one-object.bin", args.chunk_mib * MiB) == size
        gets.append(size / (time.perf_counter() - t))
        result = store.verify(big, Level.FULL)
        assert result.outcome is Outcome.VERIFIED, result.reason
        fulls.append(size / result.seconds)
    del blob

    tiny = [f"{i:08d}".encode() * 8 for i in range(args.meta_shards)]
    many = checkpoint(server, "step_000200", 200, tiny)
    manifest = Manifest.from_json(s3.get_object(Bucket=BUCKET, Key=f"ckpt/step_000200/{MANIFEST_NAME}")["Body"].read())
    metas, naives = [], []
    for _ in range(args.meta_trials):
        result = store.verify(many, Level.METADATA)
        assert result.outcome is Outcome.VERIFIED, result.reason
        metas.append(result.seconds)
        t = time.perf_counter()
        assert naive_meta(s3, manifest, "ckpt/step_000200/")
        naives.append(time.perf_counter() - t)
    get_bps, full_bps = statistics.median(gets), statistics.median(fulls)
    return {
        "server": server.name,
        "mib": args.mib,
        "shards": args.shards,
        "workers": args.workers,
        "get_mb_s": round(get_bps / 1e6, 1),
        "full_mb_s": round(full_bps / 1e6, 1),
        "full_vs_get": round(full_bps / get_bps, 3),
        "meta_shards": args.meta_shards,
        "meta_10k_s": round(statistics.median(metas), 2),
        "naive_meta_10k_s": round(statistics.median(naives), 2),
        "meta_speedup": round(statistics.median(naives) / statistics.median(metas), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=("moto", "rgw", "both"), default="moto")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--meta-shards", type=int, default=10_000)
    parser.add_argument("--meta-trials", type=int, default=2)
    args = parser.parse_args()
    quiet_logs()
    kinds = {"moto": [MotoS3], "rgw": [CephRgw], "both": [MotoS3, CephRgw]}[args.server]
    rows = []
    for cls in kinds:
        reason = cls.unavailable_reason()
        if reason:
            raise SystemExit(f"{cls.name} cannot start here: {reason}")
        with cls() as server:
            rows.append(bench_server(server, args))
    print(
        table(
            [
                [
                    r["server"],
                    f"{r['mib']} MiB / {r['shards']}",
                    r["get_mb_s"],
                    r["full_mb_s"],
                    r["full_vs_get"],
                    r["meta_10k_s"],
                    r["naive_meta_10k_s"],
                    r["meta_speedup"],
                ]
                for r in rows
            ],
            ["server", "checkpoint", "GET MB/s", "full MB/s", "full/GET", "meta 10k s", "naive 10k s", "speedup"],
        )
    )
    first = rows[0]
    print(
        json.dumps(
            {
                "full_vs_get": first["full_vs_get"],
                "meta_10k_s": first["meta_10k_s"],
                "naive_meta_10k_s": first["naive_meta_10k_s"],
                "by_server": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
