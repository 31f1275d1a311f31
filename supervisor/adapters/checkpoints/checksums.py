"""Streaming checksums in S3's encoding (base64 of the big-endian digest).

CRC64NVME and CRC32C come from awscrt (what botocore itself uses; ~12 GB/s, releases the GIL),
SHA-256 from hashlib. One ``Digest`` per shard, fed chunk by chunk: memory stays bounded.
"""

from __future__ import annotations

import base64
import hashlib

from awscrt import checksums as _crt

from supervisor.domain.checkpoints.manifest import ChecksumAlgorithm


class Digest:
    def __init__(self, algorithm: ChecksumAlgorithm) -> None:
        self.algorithm = algorithm
        self.size = 0
        self._crc = 0
        self._sha = hashlib.sha256() if algorithm is ChecksumAlgorithm.SHA256 else None

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        self.size += len(chunk)
        if self._sha is not None:
            self._sha.update(chunk)
        elif self.algorithm is ChecksumAlgorithm.CRC64NVME:
            self._crc = _crt.crc64nvme(chunk, self._crc)
        else:
            self._crc = _crt.crc32c(chunk, self._crc)

    def value(self) -> str:
        """The checksum as S3 stores it: base64 of the big-endian bytes."""
        if self._sha is not None:
            raw = self._sha.digest()
        elif self.algorithm is ChecksumAlgorithm.CRC64NVME:
            raw = self._crc.to_bytes(8, "big")
        else:
            raw = self._crc.to_bytes(4, "big")
        return base64.b64encode(raw).decode("ascii")


def checksum_of(data: bytes, algorithm: ChecksumAlgorithm = ChecksumAlgorithm.CRC64NVME) -> str:
    d = Digest(algorithm)
    d.update(data)
    return d.value()
