"""What the supervisor handed this job: the checkpoint to resume from, the iterations to skip, the
learning-rate scale (docs/checkpoint-layouts.md, *Handing a restarted job its checkpoint*).

From the environment (``SSV_RESUME_CHECKPOINT``, ``SSV_RESUME_STEP``, ``SSV_SKIP_ITERATIONS``,
``SSV_LR_SCALE``, ``SSV_RESUME_MEMORY_STEP``), or, for a job the supervisor pre-queued before its predecessor's last save
(``SSV_RESUME_FROM_FILE=1``), from the resume file ``SSV_RESUME_FILE`` alone: the supervisor rewrites
it with the newest verified checkpoint just before it releases the job. The file is read bounded
(``MAX_RESUME_FILE_BYTES``) and checked whole before any of it is used: a torn or hostile file is
``ResumeFileError``, never half a plan. No torch here: the Megatron wrapper reads orders too.

The file is read only when this process's account owns it (the daemon writes it as the job's own
account), and, when the job holds the run's key (``SSV_MANIFEST_KEY``), only when the run signed
it: in a shared sticky folder another account can create the file first, and the daemon cannot
replace it (issue 32, finding 8). The signature is the manifests' (``domain/checkpoints/signing.py``:
an HMAC-SHA256 ``"mac"`` field over the canonical JSON without it), checked here with the standard
library alone because this module stands alone.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_RESUME_FILE_BYTES = 1 << 20  # the supervisor's plans are a few KiB
MAX_LOCATION_CHARS = 4096
MAX_FALLBACKS = 256
MAX_SKIP_CHARS = 65_536
KEY_ENV = "SSV_MANIFEST_KEY"  # the run's key, hex (domain/checkpoints/signing.py)
_SIGNATURE = "mac"


class ResumeFileError(ValueError):
    """The resume file cannot be used as a whole: the message names it and what is wrong."""


@dataclass(frozen=True)
class SkipRanges:
    """Iterations not to train on: Megatron's ``--skip-train-iteration-range`` text, ``"251-380,551-600"``
    (commas or spaces between ranges, both ends included, a single number for one iteration)."""

    ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> SkipRanges:
        ranges = []
        for part in (text or "").replace(",", " ").split():
            first, sep, last = part.partition("-")
            try:
                lo, hi = int(first), int(last if sep else first)
            except ValueError:
                raise ValueError(f"skip range {part!r} is not FIRST-LAST (e.g. 251-380)") from None
            if lo < 0 or hi < lo:
                raise ValueError(f"skip range {part!r}: FIRST must be >= 0 and <= LAST")
            ranges.append((lo, hi))
        return cls(tuple(ranges))

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and any(lo <= step <= hi for lo, hi in self.ranges)


@dataclass(frozen=True)
class ResumeOrders:
    """The checkpoint to load, in order of preference, the step it holds, the iterations to skip
    and the learning-rate factor. No candidates: start from scratch."""

    candidates: tuple[str, ...] = ()
    step: int | None = None
    skip: SkipRanges = field(default_factory=SkipRanges)
    lr_scale: float = 1.0
    # SSV_RESUME_MEMORY_STEP, set for a relaunch in the same job: the newest generation of peer
    # copies the supervisor knows (0: none to restore — a rollback, or none newer than the
    # checkpoint); None: not said (no supervisor, or a new job), the trainer's own choice
    memory_step: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ResumeOrders:
        env = os.environ if env is None else env
        if _from_file(env):
            path = env.get("SSV_RESUME_FILE", "")
            if not path:
                raise ResumeFileError("SSV_RESUME_FROM_FILE=1 but SSV_RESUME_FILE is not set")
            return read_resume_file(path, _key(env))
        first = env.get("SSV_RESUME_CHECKPOINT", "")
        candidates = [first] if first else []
        if first and env.get("SSV_RESUME_FILE"):
            candidates += _fallbacks(env["SSV_RESUME_FILE"], env)
        step_text = env.get("SSV_RESUME_STEP", "")
        return cls(
            candidates=tuple(dict.fromkeys(candidates)),
            step=int(step_text) if step_text.isdigit() else None,
            skip=SkipRanges.parse(env.get("SSV_SKIP_ITERATIONS")),
            lr_scale=_scale(env.get("SSV_LR_SCALE") or 1.0, "SSV_LR_SCALE"),
            memory_step=_memory_step(env.get("SSV_RESUME_MEMORY_STEP")),
        )


def _memory_step(text: str | None) -> int | None:
    if text is None:
        return None
    return int(text) if text.isdigit() and len(text) < 20 else 0  # "" or not a step: none to restore


def _from_file(env: Mapping[str, str]) -> bool:
    flag = env.get("SSV_RESUME_FROM_FILE", "")
    if flag not in ("", "0", "1"):
        raise ValueError(f"SSV_RESUME_FROM_FILE={flag[:20]!r}: expected 1 (read the resume file) or 0")
    return flag == "1"


def _scale(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{name}={value!r}: expected a number above 0")
    try:
        scale = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected a number above 0") from None
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"{name}={value!r}: expected a number above 0")
    return scale


def _key(env: Mapping[str, str]) -> bytes | None:
    """The run's key from the environment; None without one (an older daemon's job)."""
    text = env.get(KEY_ENV, "").strip()
    if not text:
        return None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ResumeFileError(f"{KEY_ENV} is not 32 bytes of hex")
    return key


def _fallbacks(path: str, env: Mapping[str, str]) -> list[str]:
    """The older verified checkpoints of the resume file beside SSV_RESUME_CHECKPOINT; none when it
    cannot be read or is not the run's (the environment's checkpoint is still tried)."""
    try:
        plan = _load(path, _key(env))
        return [str(f["location"]) for f in plan.get("fallbacks", []) if f.get("location")]
    except (ValueError, TypeError, KeyError, AttributeError):  # ResumeFileError is a ValueError
        return []


# ---------------------------------------------------------------------- the resume file


def read_resume_file(path: str, key: bytes | None = None) -> ResumeOrders:
    """The orders of the resume file at ``path`` (``{"checkpoint": {"location", "step"} | null,
    "fallbacks": [...], "skip_iterations"?, "lr_scale"?, "mac"?}``), checked whole and, with the
    run's ``key``, checked to be signed by the run; ``ResumeFileError``."""
    try:
        return _orders_of(_load(path, key))
    except ResumeFileError as exc:
        raise ResumeFileError(f"resume file {path}: {exc}; refusing to resume from part of it") from None
    except ValueError as exc:  # SkipRanges' own words
        raise ResumeFileError(f"resume file {path}: {exc}; refusing to resume from part of it") from None


def _load(path: str, key: bytes | None) -> Mapping[str, Any]:
    doc = _parse(_read_own(path))
    if key is not None:
        _check_signature(doc, key)
    return doc


def _read_own(path: str) -> bytes:
    """The file's bytes (bounded) when it is a regular file this process's account owns."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO does not block
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise ResumeFileError("not a regular file")
            if st.st_uid != os.getuid():
                raise ResumeFileError(
                    f"owned by uid {st.st_uid}, not by this job's account (uid {os.getuid()}): another "
                    "account may have created it first in a folder others may write"
                )
            return f.read(MAX_RESUME_FILE_BYTES + 1)
    except OSError as exc:
        raise ResumeFileError(f"cannot be read ({type(exc).__name__}: {exc.strerror or exc})") from None


def _check_signature(doc: Mapping[str, Any], key: bytes) -> None:
    mac = doc.get(_SIGNATURE)
    if mac is None:
        raise ResumeFileError(f"not signed by the run although {KEY_ENV} is set: someone else wrote it")
    body = json.dumps({k: v for k, v in doc.items() if k != _SIGNATURE}, sort_keys=True, separators=(",", ":"))
    expected = "hmac-sha256:" + hmac.new(key, body.encode("ascii"), hashlib.sha256).hexdigest()
    if not isinstance(mac, str) or not hmac.compare_digest(mac, expected):
        raise ResumeFileError("its signature is not the run's: written by someone else, or edited")


def _parse(data: bytes) -> Mapping[str, Any]:
    if len(data) > MAX_RESUME_FILE_BYTES:
        raise ResumeFileError(f"larger than {MAX_RESUME_FILE_BYTES} bytes")
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ResumeFileError("not whole JSON (torn, or not a resume file)") from None
    if not isinstance(doc, dict):
        raise ResumeFileError(f"not an object but {type(doc).__name__}")
    if "checkpoint" not in doc:
        raise ResumeFileError("no 'checkpoint' key (null: start from scratch)")
    return doc


def _no_constant(name: str) -> float:
    raise ResumeFileError(f"lr_scale or another value is {name}, not a number")


def _orders_of(doc: Mapping[str, Any]) -> ResumeOrders:
    chosen = doc["checkpoint"]
    skip, scale = doc.get("skip_iterations"), doc.get("lr_scale")
    if skip is not None and (not isinstance(skip, str) or len(skip) > MAX_SKIP_CHARS):
        raise ResumeFileError(f"skip_iterations is not text of at most {MAX_SKIP_CHARS} characters")
    orders = ResumeOrders(
        skip=SkipRanges.parse(skip),
        lr_scale=1.0 if scale is None else _file_scale(scale),
    )
    if chosen is None:
        return orders  # no verified checkpoint: from scratch, the fallbacks unused
    location, step = _pick(chosen, "checkpoint")
    fallbacks = doc.get("fallbacks") or []
    if not isinstance(fallbacks, list) or len(fallbacks) > MAX_FALLBACKS:
        raise ResumeFileError(f"fallbacks is not a list of at most {MAX_FALLBACKS}")
    older = [_pick(f, "fallbacks")[0] for f in fallbacks]
    return ResumeOrders(tuple(dict.fromkeys([location, *older])), step, orders.skip, orders.lr_scale)


def _file_scale(value: object) -> float:
    if isinstance(value, str):
        raise ResumeFileError(f"lr_scale {value[:20]!r} is text, not a number")
    try:
        return _scale(value, "lr_scale")
    except ValueError as exc:
        raise ResumeFileError(str(exc)) from None


def _pick(doc: object, where: str) -> tuple[str, int | None]:
    if not isinstance(doc, dict):
        raise ResumeFileError(f"{where} is not an object with a location")
    location, step = doc.get("location"), doc.get("step")
    if not isinstance(location, str) or not _sane_location(location):
        raise ResumeFileError(f"{where}: location {str(location)[:80]!r} is not a checkpoint path or URL")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ResumeFileError(f"{where}: step {str(step)[:20]!r} is not a whole number >= 0")
    return location, step


def _sane_location(location: str) -> bool:
    """Non-empty, bounded, no control characters, not an option (a path or URL as the supervisor
    writes them)."""
    return 0 < len(location) <= MAX_LOCATION_CHARS and not location.startswith("-") and location.isprintable()
