"""Who vouches for a checkpoint: the manifest's signature, and the run's ``[checkpoints] trust``.

Verification proves a checkpoint is whole; it does not prove who wrote it. Where the checkpoint
root is a folder or a bucket prefix other accounts can write (a group project space, a 1777
scratch, a shared bucket), a planted ``step_99999999`` with a well-formed manifest would be the
newest verified checkpoint and the next restart would load its weights. So a manifest carries an
HMAC-SHA256 over its own content under a key only the run's job and its daemon hold:

* the key is derived from the run's token, which the daemon keeps in its store and never logs
  (``manifest_key``); the daemon hands it to every job it submits as ``SSV_MANIFEST_KEY`` (hex),
  and the trainer's commit (``commit_checkpoint``, ``slurm-supervisor ckpt commit``, the torch,
  HF and survivors helpers, all through it) signs with it when it is set;
* the signature is the manifest's ``"mac"`` field, ``"hmac-sha256:<hex>"``, computed over the
  manifest's JSON object without that field, serialized canonically (sorted keys, no spaces,
  ASCII): a reader re-serializes what it parsed, so whitespace does not matter. The field is new
  in format 1 and optional: readers that do not know it ignore it, and unsigned manifests (older
  writers, a commit by hand outside the job) still read.

What a signature is worth, and what an unsigned manifest is, is the run's policy (``domain.run.Trust``,
checked in ``domain.checkpoints.origin``).
Everything here is pure.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from enum import StrEnum
from typing import Any

SIGNATURE_FIELD = "mac"
SCHEME = "hmac-sha256"
KEY_ENV = "SSV_MANIFEST_KEY"  # the job's environment: the run's manifest key, hex
_KEY_CONTEXT = b"slurm-supervisor manifest key v1"


class Origin(StrEnum):
    """What the manifest's signature says of where it came from."""

    SIGNED = "signed"  # signed with the run's key: its job or its daemon wrote it
    UNSIGNED = "unsigned"  # no signature: nobody vouches for its origin
    FORGED = "forged"  # a signature that does not match the run's key: someone else wrote it, or it was edited


def manifest_key(run_token: str) -> bytes:
    """The run's manifest key: HMAC of a fixed context under the run token (the token itself is
    never used as a key for anything else than the ingest)."""
    return hmac.new(run_token.encode(), _KEY_CONTEXT, hashlib.sha256).digest()


def parse_key(text: str) -> bytes:
    """A key as handed over in ``SSV_MANIFEST_KEY``; ValueError when it is not 32 bytes of hex."""
    try:
        key = bytes.fromhex(text.strip())
    except ValueError as exc:
        raise ValueError(f"{KEY_ENV} is not hex") from exc
    if len(key) != 32:
        raise ValueError(f"{KEY_ENV} is {len(key)} bytes, not 32")
    return key


def _canonical(doc: dict[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != SIGNATURE_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _mac(doc: dict[str, Any], key: bytes) -> str:
    return f"{SCHEME}:{hmac.new(key, _canonical(doc), hashlib.sha256).hexdigest()}"


def signed_json(doc: dict[str, Any], key: bytes) -> str:
    """The manifest document ``doc`` as JSON text with its signature under ``key``."""
    return json.dumps({**doc, SIGNATURE_FIELD: _mac(doc, key)}, indent=1, sort_keys=True)


def origin(doc: dict[str, Any], key: bytes | None) -> tuple[Origin, str]:
    """(what the signature of the parsed manifest ``doc`` says, why) under the run's ``key``
    (None: the reader holds no key, so a signature cannot be checked and counts as none)."""
    mac = doc.get(SIGNATURE_FIELD)
    if mac is None:
        return Origin.UNSIGNED, "the manifest is not signed: nobody vouches for its origin"
    if key is None:
        return Origin.UNSIGNED, "the manifest is signed, but no key to check it here: nobody vouches for its origin"
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(doc, key)):
        return (
            Origin.FORGED,
            "the manifest's signature does not match the run's key: written by someone else, or edited",
        )
    return Origin.SIGNED, "signed with the run's key"
