"""S3-compatible servers started by the test harness, on loopback: moto and Ceph's RADOS Gateway.

Both have the same shape (``with MotoS3() as s3:`` / ``start()`` and ``stop()``): an
``endpoint_url``, credentials, ``client()`` for a boto3 client with timeouts set,
``create_bucket``, and two ways of corrupting an object at rest, below the S3 API, so that the
server's own metadata (ETag, stored checksums, size) still describe the original:
``flip_bit_at_rest`` and ``truncate_at_rest``.

* ``MotoS3`` — moto's server as a subprocess (``supervisor.testing.servers._moto_main``; ~0.5 s to start)
  with a test-only door that alters stored bytes inside moto's backend.
* ``CephRgw`` — one mon, one OSD (memstore) and radosgw from Debian's Ceph 16 packages (~13 s to
  start; see ``supervisor.testing.servers._ceph``); at-rest changes go through librados (``rados``) into
  the bucket data pool.

``unavailable_reason()`` on each class says why it cannot start here (None when it should).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import boto3
import structlog
from botocore.config import Config

from supervisor.testing.servers._ceph import CephCluster, CephError, ceph_unavailable_reason
from supervisor.testing.slurm._daemon import free_ports

log = structlog.get_logger()

__all__ = ["CephRgw", "MotoS3", "S3Server", "S3ServerError"]


class S3ServerError(RuntimeError):
    """A test S3 server could not start, or an at-rest change could not be made."""


class S3Server:
    """What the two servers share. Subclasses set ``endpoint_url`` and the credentials."""

    name = "s3"
    region = "us-east-1"

    def __init__(self) -> None:
        self.endpoint_url = ""
        self.access_key = ""
        self.secret_key = ""
        self._admin: Any = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> S3Server:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def credentials_env(self) -> dict[str, str]:
        """Environment variables that give boto3's default chain this server's credentials."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def client(self, *, endpoint_url: str | None = None, read_timeout: float = 30.0, max_attempts: int = 3) -> Any:
        config = Config(
            connect_timeout=5.0,
            read_timeout=read_timeout,
            retries={"mode": "standard", "max_attempts": max_attempts},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            max_pool_connections=32,
        )
        return boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url or self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=config,
        )

    def admin_client(self) -> Any:
        """One shared client with the defaults, for setting up and damaging test data."""
        if self._admin is None:
            self._admin = self.client()
        return self._admin

    def create_bucket(self, bucket: str, *, versioned: bool = False) -> None:
        s3 = self.admin_client()
        s3.create_bucket(Bucket=bucket)
        if versioned:
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})

    def flip_bit_at_rest(self, bucket: str, key: str, offset: int) -> None:
        """Flip the lowest bit of byte ``offset`` of the stored object, without the S3 API."""
        raise NotImplementedError

    def truncate_at_rest(self, bucket: str, key: str, size: int) -> None:
        """Cut the stored object's bytes to ``size``, without the S3 API (its recorded size stays)."""
        raise NotImplementedError


def _answers_http(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"GET / HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            return s.recv(12).startswith(b"HTTP/1.")
    except OSError:
        return False


class MotoS3(S3Server):
    """moto's S3 server as a subprocess on a free loopback port."""

    name = "moto"

    def __init__(self, *, ready_timeout: float = 30.0, log_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__()
        self.access_key, self.secret_key = "testing", "testing"
        self.ready_timeout = ready_timeout
        self._log_dir = log_dir
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path()

    @staticmethod
    def unavailable_reason() -> str | None:
        try:
            import moto.server  # noqa: F401
            import werkzeug  # noqa: F401
        except ImportError as exc:
            return f"moto's server cannot be imported ({exc}); pip install 'moto[server]'"
        return None

    def start(self) -> MotoS3:
        reason = self.unavailable_reason()
        if reason:
            raise S3ServerError(reason)
        self.port = free_ports(1)[0]
        self.endpoint_url = f"http://127.0.0.1:{self.port}"
        fd, name = tempfile.mkstemp(prefix="moto-", suffix=".log", dir=self._log_dir)
        self.log_path = Path(name)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MOTO_"))}
        with os.fdopen(fd, "ab") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
                [sys.executable, "-m", "supervisor.testing.servers._moto_main", "--port", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.ready_timeout
        while not _answers_http(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise S3ServerError(f"moto server did not answer on port {self.port}:\n{tail}")
            time.sleep(0.05)
        log.info("moto.started", port=self.port)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)
        self.proc = None
        if self.log_path != Path():
            self.log_path.unlink(missing_ok=True)

    def _at_rest(self, bucket: str, key: str, **params: str | int) -> None:
        query = urlencode({"bucket": bucket, "key": key, **params})
        req = urllib.request.Request(f"{self.endpoint_url}/_ssv_at_rest?{query}", method="POST", data=b"")  # noqa: S310 - loopback test server
        try:
            with urllib.request.urlopen(req, timeout=10.0) as resp:  # noqa: S310 - loopback test server
                resp.read()
        except urllib.error.HTTPError as exc:
            raise S3ServerError(f"no object s3://{bucket}/{key} in moto ({exc.code})") from exc

    def flip_bit_at_rest(self, bucket: str, key: str, offset: int) -> None:
        self._at_rest(bucket, key, op="flip", offset=offset)

    def truncate_at_rest(self, bucket: str, key: str, size: int) -> None:
        self._at_rest(bucket, key, op="truncate", size=size)


class CephRgw(S3Server):
    """Ceph's RADOS Gateway on a private one-OSD cluster (``supervisor.testing.servers._ceph``)."""

    name = "ceph-rgw"

    def __init__(
        self, base_dir: str | os.PathLike[str] | None = None, *, keep_dir: bool = False, ready_timeout: float = 60.0
    ) -> None:
        super().__init__()
        self.cluster = CephCluster(base_dir, keep_dir=keep_dir, ready_timeout=ready_timeout)

    @staticmethod
    def unavailable_reason() -> str | None:
        return ceph_unavailable_reason()

    def start(self) -> CephRgw:
        try:
            self.cluster.start()
        except (CephError, subprocess.SubprocessError, OSError) as exc:
            raise S3ServerError(f"Ceph RGW did not start: {exc}") from exc
        self.endpoint_url = self.cluster.endpoint_url
        self.access_key, self.secret_key = self.cluster.access_key, self.cluster.secret_key
        return self

    def stop(self) -> None:
        self.cluster.stop()

    def rados_name(self, bucket: str, key: str) -> str:
        """The RADOS object holding the head (first 4 MiB) of ``key``: ``<bucket marker>_<key>``."""
        wanted = f"_{key}"
        found = [n for n in self.cluster.rados_objects() if n.endswith(wanted) and "__shadow_" not in n]
        marker = self.bucket_marker(bucket)
        found = [n for n in found if n == f"{marker}{wanted}"]
        if not found:
            raise S3ServerError(f"no RADOS head object for s3://{bucket}/{key}")
        return found[0]

    def bucket_marker(self, bucket: str) -> str:
        out = self.cluster.radosgw_admin("bucket", "stats", "--bucket", bucket)
        return str(json.loads(out)["marker"])

    def flip_bit_at_rest(self, bucket: str, key: str, offset: int) -> None:
        name = self.rados_name(bucket, key)
        data = bytearray(self.cluster.rados_get(name))
        if offset >= len(data):
            raise S3ServerError(
                f"offset {offset} is beyond the head object ({len(data)} bytes); "
                "use a smaller offset (tails live in __shadow_ objects)"
            )
        data[offset] ^= 0x01
        self.cluster.rados_put(name, bytes(data))

    def truncate_at_rest(self, bucket: str, key: str, size: int) -> None:
        name = self.rados_name(bucket, key)
        self.cluster.rados("-p", "default.rgw.buckets.data", "truncate", name, str(size))


def session_server(cls: type[MotoS3] | type[CephRgw], **kwargs: Any) -> Iterator[S3Server | str]:
    """For a session fixture: the started server, or why it cannot run (a test then skips, or
    fails under ``CI=true``); stopped when the session ends."""
    reason = cls.unavailable_reason()
    if reason:
        yield reason
        return
    server = cls(**kwargs)
    try:
        server.start()
    except S3ServerError as exc:
        yield str(exc)
        return
    try:
        yield server
    finally:
        server.stop()
