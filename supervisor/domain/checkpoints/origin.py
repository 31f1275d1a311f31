"""Whether a checkpoint's origin is trusted: its signature and, on POSIX, who owns its files.

The problems found are ``ShardProblem(problem="origin")``: a checkpoint with one is CORRUPT for the
run (never resumed from; the logbook names the owner or the signature), whatever its bytes are.
Under ``Trust.OWNER`` (the default) a checkpoint nobody vouches for — an unsigned manifest, an
adopted layout — is still accepted, and ``unvouched`` says so for the logbook. The policy is the
run's ``[checkpoints] trust``; see ``domain.checkpoints.signing``.
"""

from __future__ import annotations

import stat
from collections.abc import Iterable

from supervisor.domain.checkpoints.manifest import MANIFEST_NAME, ObjectInfo, ShardProblem
from supervisor.domain.checkpoints.signing import Origin
from supervisor.domain.run import Trust

ROOT_UID = 0  # root's files are trusted too: root can do anything anyway


def signature_problems(trust: Trust, found: Origin, why: str) -> list[ShardProblem]:
    """A forged signature is refused under any trust but ``any``; an unsigned manifest only under ``strict``."""
    if trust is Trust.ANY or found is Origin.SIGNED:
        return []
    if found is Origin.FORGED:
        return [ShardProblem(MANIFEST_NAME, "origin", why)]
    if trust is Trust.STRICT:
        return [ShardProblem(MANIFEST_NAME, "origin", f'{why}; [checkpoints] trust = "strict" needs a signed manifest')]
    return []


def adopted_problems(trust: Trust, what: str) -> list[ShardProblem]:
    """An adopted layout carries no signature: refused under ``strict``."""
    if trust is not Trust.STRICT:
        return []
    return [ShardProblem(what, "origin", f'{UNVOUCHED} ([checkpoints] trust = "strict" resumes only signed manifests)')]


UNVOUCHED = "no manifest signed by the run: nobody vouches for its origin"


def ownership_problems(objects: Iterable[ObjectInfo], uid: int, trust: Trust) -> list[ShardProblem]:
    """Files and folders of the checkpoint (POSIX: ``owner`` and ``mode`` set) that another account
    owns, or, under ``strict``, that group or others may write. S3 objects carry no owner: none."""
    if trust is Trust.ANY:
        return []
    return [p for o in objects if (p := _problem(o, uid, trust)) is not None]


def _problem(o: ObjectInfo, uid: int, trust: Trust) -> ShardProblem | None:
    if o.owner is not None and o.owner not in (uid, ROOT_UID):
        return ShardProblem(o.key, "origin", f"owned by uid {o.owner}, not by the run's account (uid {uid})")
    if trust is Trust.STRICT and o.mode is not None and o.mode & (stat.S_IWGRP | stat.S_IWOTH):
        return ShardProblem(
            o.key,
            "origin",
            f'writable by group or others (mode {stat.S_IMODE(o.mode):04o}); [checkpoints] trust = "strict" refuses it',
        )
    return None
