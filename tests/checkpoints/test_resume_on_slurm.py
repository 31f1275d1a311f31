"""The whole loop on real parts: the real daemon, a real Slurm, a real S3 server (moto over HTTP).

A trainer saves checkpoints 100 and 200 (shards uploaded with CRC64NVME, then the manifest
committed with the trainer API), starts uploading 300, and its node dies half-way. The daemon
must restart the run on healthy nodes and hand it checkpoint 200 — never the torn 300 — and the
logbook must say why.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest

from supervisor.testing.slurm.daemon import SupervisorProcess, spared_run

pytestmark = [pytest.mark.slurm, pytest.mark.s3]

TRAINER = """
import os, sys, time
import boto3
from botocore.config import Config
from supervisor.adapters.checkpoints.commit import build_manifest, commit_checkpoint
from supervisor.adapters.checkpoints.s3 import S3Backend

root, marks = os.environ["CKPT_ROOT"], os.environ["MARKS"]
attempt = os.environ["SLURM_SUPERVISOR_ATTEMPT"]
with open(marks, "a") as f:
    f.write("start attempt=%s step=%s ckpt=%s file=%s node=%s\\n" % (
        attempt, os.environ.get("SSV_RESUME_STEP"), os.environ.get("SSV_RESUME_CHECKPOINT"),
        os.environ.get("SSV_RESUME_FILE"), os.environ.get("SLURMD_NODENAME")))
if attempt == "0":
    endpoint = os.environ["CKPT_ENDPOINT"]
    s3 = boto3.client("s3", endpoint_url=endpoint, config=Config(request_checksum_calculation="when_required"))
    bucket, prefix = root[5:].split("/", 1)
    backend = S3Backend(root, endpoint_url=endpoint)

    def upload(step, shard):
        body = os.urandom(256 * 1024)
        s3.put_object(Bucket=bucket, Key="%sstep_%06d/shard-%d.pt" % (prefix, step, shard), Body=body,
                      ChecksumAlgorithm="CRC64NVME")

    for step in (100, 200):
        for shard in range(4):
            upload(step, shard)
        name = "step_%06d" % step
        commit_checkpoint(backend, name, build_manifest(backend, name, step, writer="rank0"))
    upload(300, 0)
    upload(300, 1)  # ... and the node dies before shards 2, 3 and the manifest
    with open(marks, "a") as f:
        f.write("uploading 300\\n")
time.sleep(3600)
"""


def wait_for(path: Path, text: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if any(text in line for line in lines):
            return lines
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {path} within {timeout} s: {path.read_text() if path.exists() else ''}")


def test_node_dies_while_checkpoint_n_plus_1_is_half_uploaded_restart_gets_n(slurm_cluster, moto_s3, tmp_path):
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    moto_s3.create_bucket(bucket)
    root = f"s3://{bucket}/llm/"
    marks = tmp_path / "marks.txt"
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    spec = spared_run(
        slurm_cluster,
        tmp_path,
        script_body=f'srun --ntasks-per-node=1 sleep 3600 &\nexec "{sys.executable}" "{trainer}"\n',
        # the trainer's own credentials: the daemon's never reach a job
        env={
            "MARKS": str(marks),
            "CKPT_ROOT": root,
            "CKPT_ENDPOINT": moto_s3.endpoint_url,
            **moto_s3.credentials_env(),
        },
    )
    resume_file = tmp_path / "resume.json"
    with spec.open("a") as f:
        f.write(
            f'[checkpoints]\nroot = "{root}"\nendpoint_url = "{moto_s3.endpoint_url}"\n'
            f'scan_interval_s = 1\nresume_file = "{resume_file}"\n'
        )
    sup = SupervisorProcess(slurm_cluster, tmp_path)
    sup.start(env=moto_s3.credentials_env())
    try:
        sup.cli("submit", str(spec))
        first = sup.wait_running("llm", attempt=0)
        wait_for(marks, "uploading 300", timeout=60)
        time.sleep(2.0)  # a scan or two: the supervisor sees 100 and 200 verified, 300 without its manifest
        batch_node = first["running_on"][0]
        slurm_cluster.crash_node(batch_node)
        sup.wait_running("llm", attempt=1, avoid=[batch_node], timeout=60)
        lines = wait_for(marks, "start attempt=1", timeout=30)
    finally:
        rc = sup.stop()
    assert rc == 0
    second = next(line for line in lines if line.startswith("start attempt=1"))
    assert f"step=200 ckpt={root}step_000200/ file={resume_file}" in second, second
    plan = json.loads(resume_file.read_text())
    assert plan["checkpoint"]["step"] == 200 and [f["step"] for f in plan["fallbacks"]] == [100]
    assert plan["skipped"][0]["step"] == 300 and "commit marker" in plan["skipped"][0]["why"]
    book = sup.logbook("llm")
    restarted = [e for e in book if e["kind"] == "restarted"]
    assert restarted and "resuming from step 200" in restarted[0]["message"], restarted
    assert "step 300 skipped: no commit marker" in restarted[0]["message"]
    verified = {(e["evidence"]["step"], e["evidence"]["level"]) for e in book if e["kind"] == "checkpoint_verified"}
    assert {(100, "metadata"), (200, "metadata")} <= verified, verified
    assert not [e for e in book if e["kind"] == "checkpoint_corrupt"]  # an upload cut short is not corrupt
