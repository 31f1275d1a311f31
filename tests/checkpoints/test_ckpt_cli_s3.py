"""`slurm-supervisor ckpt` against a real S3 server over HTTP (moto): commit uses the checksums
the server keeps, list and verify see the commit, a bit flip at rest is caught at full level, and
a second commit is refused."""

from __future__ import annotations

import json
import os
import uuid

import pytest
from click.testing import CliRunner, Result

from supervisor.adapters.checkpoints.checksums import checksum_of
from supervisor.cli import main
from supervisor.domain.checkpoints.manifest import MANIFEST_NAME, Manifest
from supervisor.testing.servers.s3servers import S3Server

pytestmark = pytest.mark.s3


def ssv(server: S3Server, *args: str) -> Result:
    return CliRunner(env=server.credentials_env()).invoke(
        main, ["ckpt", *args, "--endpoint-url", server.endpoint_url], catch_exceptions=False
    )


def test_commit_list_verify_on_s3(moto_s3: S3Server) -> None:
    bucket = f"cli-{uuid.uuid4().hex[:8]}"
    moto_s3.create_bucket(bucket)
    s3 = moto_s3.client()
    shards = {f"run42/ckpt/step_000100/model/rank{i}.pt": os.urandom(5000 + i) for i in range(3)}
    for key, data in shards.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data, ChecksumAlgorithm="CRC64NVME")
    s3.put_object(Bucket=bucket, Key="run42/ckpt/step_000200/model/rank0.pt", Body=b"torn")
    root = f"s3://{bucket}/run42/ckpt/"

    res = ssv(moto_s3, "commit", root, "step_000100", "--step", "100")
    assert res.exit_code == 0, res.output
    assert f"-> s3://{bucket}/run42/ckpt/step_000100/" in res.stdout
    body = s3.get_object(Bucket=bucket, Key=f"run42/ckpt/step_000100/{MANIFEST_NAME}")["Body"].read()
    manifest = Manifest.from_json(body)
    assert {s.key: s.checksum for s in manifest.shards} == {
        k.rsplit("step_000100/", 1)[1]: checksum_of(v) for k, v in shards.items()
    }

    doc = json.loads(ssv(moto_s3, "list", root, "--json").stdout)
    assert [(c["step"], c["committed"], c["guarantee"]) for c in doc["checkpoints"]] == [
        (100, True, "manifest"),
        (200, False, "manifest"),
    ]

    assert ssv(moto_s3, "verify", root, "step_000100", "--level", "full").exit_code == 0
    moto_s3.flip_bit_at_rest(bucket, "run42/ckpt/step_000100/model/rank1.pt", 10)
    assert ssv(moto_s3, "verify", root, "step_000100").exit_code == 0  # invisible to HEAD
    res = ssv(moto_s3, "verify", root, "step_000100", "--level", "full")
    assert res.exit_code == 1 and "model/rank1.pt: checksum" in res.stdout, res.output

    res = ssv(moto_s3, "commit", root, "step_000100", "--step", "100")
    assert res.exit_code == 1 and "already has ssv-manifest.json" in res.output


def test_unreachable_endpoint_is_a_storage_error_not_corrupt(moto_s3: S3Server) -> None:
    env = {**moto_s3.credentials_env(), "AWS_MAX_ATTEMPTS": "1"}
    res = CliRunner(env=env).invoke(
        main, ["ckpt", "list", "s3://nobucket/x/", "--endpoint-url", "http://127.0.0.1:9"], catch_exceptions=False
    )
    assert res.exit_code == 2 and "cannot list s3://nobucket/x/" in res.output, res.output
