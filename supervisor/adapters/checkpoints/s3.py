"""ObjectBackend over S3-compatible storage (boto3).

Choices, and why:

* **Timeouts always set** (connect 5 s, read 30 s by default): a restore from blob storage that
  hangs is one of the failures this project exists for; a GET without a read timeout can block
  forever (Ceph with a corrupt object in one replica hangs for minutes).
* **Retries** are botocore's: ``standard`` mode by default (exponential backoff with jitter,
  retries on throttling, 5xx, timeouts and connection errors), ``adaptive`` on request (adds
  client-side rate limiting after throttling). ``max_attempts`` counts the first try. A stream
  that fails part-way is not retried here (botocore cannot resume it); the verifier retries the
  shard.
* **Checksums**: ``request_checksum_calculation="when_required"`` because recent boto3 otherwise
  sends trailing (aws-chunked) checksums on every PUT, which older servers refuse; writes instead
  carry ``Content-MD5``, which every server we know of checks. ``response_checksum_validation=
  "when_required"`` because the verifier computes the checksum itself, once, against the writer's
  manifest; letting botocore validate too would hash every byte twice. HEAD asks for stored
  checksums with ``ChecksumMode=ENABLED``; composite (multipart, ``...-N``) values are dropped:
  they are not a checksum of the object's bytes and cannot be compared with a manifest's.
* **Conditional writes**: ``put(if_absent=True)`` sends ``IfNoneMatch='*'``. Some servers ignore
  the header and overwrite; the first conditional write of a backend therefore probes the server
  once (write a probe object, write it again conditionally, expect 412). Where it is not
  honoured the backend falls back to HEAD-then-PUT, which is racy (two writers may both see "absent"),
  and says so in the log.
* **Errors** become StorageError: ``transient`` for timeouts, connection resets, 5xx, SlowDown and
  other throttling; not for access denied, missing bucket, bad credentials. Credentials come from
  boto3's normal chain (environment, config files, instance roles) and are never logged.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.exceptions as bce
import structlog
from botocore.config import Config
from urllib3.exceptions import HTTPError as Urllib3Error

from supervisor.adapters.checkpoints.backend import StorageError
from supervisor.domain.checkpoints.manifest import ChecksumAlgorithm, ObjectInfo

log = structlog.get_logger()

_ABSENT_CODES = frozenset({"NoSuchKey", "404", "NotFound", "NoSuchVersion"})
_PERMANENT_CODES = frozenset(
    {
        "AccessDenied",
        "NoSuchBucket",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AllAccessDisabled",
        "InvalidBucketName",
        "AccountProblem",
        "InvalidObjectState",
        "MethodNotAllowed",
        "403",
        "Forbidden",
        "NotImplemented",
        "501",
    }
)
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "503",
        "500",
        "ConditionalRequestConflict",
        "OperationAborted",
    }
)
_CHECKSUM_FIELDS = {a: f"Checksum{a.s3_name}" for a in ChecksumAlgorithm}


def parse_s3_root(root: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix/"); ValueError naming the fix."""
    if not root.startswith("s3://"):
        raise ValueError(f"S3 root {root!r} does not start with s3:// (write it as s3://BUCKET/PREFIX/)")
    bucket, _, prefix = root[len("s3://") :].partition("/")
    if not bucket or any(c in bucket for c in " \\?#"):
        raise ValueError(f"S3 root {root!r} names no valid bucket (write it as s3://BUCKET/PREFIX/)")
    prefix = prefix.strip("/")
    return bucket, (prefix + "/" if prefix else "")


def storage_error(exc: BaseException, what: str) -> StorageError:
    """Map a botocore/urllib3 exception onto StorageError(transient=...). Never includes secrets."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, bce.ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        transient = code in _TRANSIENT_CODES or status >= 500 or status == 429 or status == 409
        if code in _PERMANENT_CODES:
            transient = False
        return StorageError(f"{what}: {code or status}: {err.get('Message') or 'no message'}", transient=transient)
    if isinstance(
        exc,
        (
            bce.NoCredentialsError,
            bce.PartialCredentialsError,
            bce.ParamValidationError,
            bce.UnknownSignatureVersionError,
        ),
    ):
        return StorageError(f"{what}: {type(exc).__name__}: {exc}", transient=False)
    return StorageError(f"{what}: {type(exc).__name__}: {exc}", transient=True)


_CAUGHT = (bce.BotoCoreError, bce.ClientError, Urllib3Error, OSError)


def _is_absent(exc: bce.ClientError) -> bool:
    return str(exc.response.get("Error", {}).get("Code", "")) in _ABSENT_CODES


class S3Backend:
    """Objects under ``s3://bucket/prefix/``. Safe to share between threads (one boto3 client)."""

    stores_checksums = True  # HEAD may return a stored checksum (S3, moto; not Ceph 16)

    def __init__(
        self,
        root: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_attempts: int = 5,
        retry_mode: str = "standard",
        max_pool_connections: int = 32,
        addressing_style: str | None = None,
    ) -> None:
        if connect_timeout <= 0 or read_timeout <= 0:
            raise ValueError("S3 connect_timeout and read_timeout must be > 0 seconds (no unbounded waits)")
        if max_attempts < 1:
            raise ValueError("S3 max_attempts must be >= 1 (it counts the first try)")
        if retry_mode not in ("standard", "adaptive", "legacy"):
            raise ValueError(f"S3 retry_mode {retry_mode!r} is not one of standard, adaptive, legacy")
        self.bucket, self.prefix = parse_s3_root(root)
        self.root = f"s3://{self.bucket}/{self.prefix}"
        self.endpoint_url = endpoint_url
        self._conditional: bool | None = None  # None until probed
        self._probe_lock = threading.Lock()
        if client is None:
            config = Config(
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                retries={"mode": retry_mode, "max_attempts": max_attempts},
                max_pool_connections=max_pool_connections,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                s3={"addressing_style": addressing_style} if addressing_style else None,
            )
            client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
        self.client = client

    def _key(self, key: str) -> str:
        return self.prefix + key.lstrip("/")

    def location(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    # ----------------------------------------------------------------- reading

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        full = self._key(prefix)
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
            for page in pages:
                for obj in page.get("Contents", ()):
                    key = obj["Key"][len(self.prefix) :]
                    modified = obj.get("LastModified")
                    yield ObjectInfo(
                        key, int(obj.get("Size", 0)), modified_at=modified.timestamp() if modified is not None else None
                    )
        except _CAUGHT as exc:
            raise storage_error(exc, f"listing {self.location(prefix)}") from exc

    def head(self, key: str, algorithm: ChecksumAlgorithm | None = None) -> ObjectInfo | None:
        try:
            resp = self.client.head_object(Bucket=self.bucket, Key=self._key(key), ChecksumMode="ENABLED")
        except bce.ClientError as exc:
            if _is_absent(exc):
                return None
            raise storage_error(exc, f"HEAD {self.location(key)}") from exc
        except _CAUGHT as exc:
            raise storage_error(exc, f"HEAD {self.location(key)}") from exc
        return self._info(key, resp)

    @staticmethod
    def _info(key: str, resp: dict[str, Any]) -> ObjectInfo:
        checksums: dict[str, str] = {}
        if resp.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
            for algo, field in _CHECKSUM_FIELDS.items():
                value = resp.get(field)
                if isinstance(value, str) and value and "-" not in value:
                    checksums[algo.value] = value
        version = resp.get("VersionId")
        modified = resp.get("LastModified")
        return ObjectInfo(
            key,
            int(resp.get("ContentLength", 0)),
            checksums,
            version if version and version != "null" else None,
            modified.timestamp() if modified is not None else None,
        )

    def read(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        where = f"GET {self.location(key)}"
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except bce.ClientError as exc:
            if _is_absent(exc):
                raise KeyError(key) from exc
            raise storage_error(exc, where) from exc
        except _CAUGHT as exc:
            raise storage_error(exc, where) from exc
        body = resp["Body"]
        try:
            yield from body.iter_chunks(chunk_size)
        except _CAUGHT as exc:
            raise storage_error(exc, f"{where} (part-way through the body)") from exc
        finally:
            body.close()

    def get_small(self, key: str, max_bytes: int = 16 << 20) -> bytes | None:
        where = f"GET {self.location(key)}"
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except bce.ClientError as exc:
            if _is_absent(exc):
                return None
            raise storage_error(exc, where) from exc
        except _CAUGHT as exc:
            raise storage_error(exc, where) from exc
        body = resp["Body"]
        try:
            if int(resp.get("ContentLength") or 0) > max_bytes:
                raise ValueError(f"{self.location(key)} is {resp['ContentLength']} bytes, more than {max_bytes}")
            parts, size = [], 0
            for chunk in body.iter_chunks(1 << 20):
                size += len(chunk)
                if size > max_bytes:
                    raise ValueError(f"{self.location(key)} is more than {max_bytes} bytes")
                parts.append(chunk)
            return b"".join(parts)
        except _CAUGHT as exc:
            raise storage_error(exc, f"{where} (part-way through the body)") from exc
        finally:
            body.close()

    # ----------------------------------------------------------------- writing

    def put(self, key: str, data: bytes, *, if_absent: bool = False) -> bool:
        if if_absent and not self.conditional_writes_supported():
            log.warning(
                "s3.put_check_then_write",
                location=self.location(key),
                why="server ignores IfNoneMatch; HEAD-then-PUT is racy",
            )
            if self.head(key) is not None:
                return False
            if_absent = False
        return self._put(key, data, if_absent=if_absent)

    def _put(self, key: str, data: bytes, *, if_absent: bool) -> bool:
        args: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._key(key),
            "Body": data,
            # S3 requires MD5 here (an integrity check of the upload, not a security hash)
            "ContentMD5": base64.b64encode(hashlib.md5(data).digest()).decode(),  # noqa: S324
        }
        if if_absent:
            args["IfNoneMatch"] = "*"
        try:
            self.client.put_object(**args)
        except bce.ClientError as exc:
            if if_absent and str(exc.response.get("Error", {}).get("Code")) in ("PreconditionFailed", "412"):
                return False
            raise storage_error(exc, f"PUT {self.location(key)}") from exc
        except _CAUGHT as exc:
            raise storage_error(exc, f"PUT {self.location(key)}") from exc
        return True

    def conditional_writes_supported(self) -> bool:
        """Whether the server honours ``IfNoneMatch='*'`` on PUT; probed once (3 requests)."""
        with self._probe_lock:
            if self._conditional is None:
                self._conditional = self._probe_conditional()
                log.info(
                    "s3.conditional_writes", bucket=self.bucket, endpoint=self.endpoint_url, supported=self._conditional
                )
            return self._conditional

    def _probe_conditional(self) -> bool:
        key = f".ssv-probe/{uuid.uuid4().hex}"
        try:
            self._put(key, b"probe", if_absent=False)
            try:
                return not self._put(key, b"probe again", if_absent=True)
            except StorageError as exc:
                if exc.transient:
                    raise
                return False  # refused outright (NotImplemented, InvalidArgument): unsupported
        finally:
            try:
                self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
            except _CAUGHT as exc:
                log.warning("s3.probe_cleanup_failed", location=self.location(key), error=type(exc).__name__)
