"""Issue 32, finding 7: a checkpoint another account planted in a shared root is not resumed from.

The attack (security review 2026-12-02, ``ckpt_planted_by_other_user.py``): beside the account's
``step_000100`` another user writes ``step_99999999`` with a well-formed manifest built by the
project's own commit; it verified at full level and was the next restart's checkpoint. Here the
same on a real directory: a planted checkpoint owned by another UID, a manifest rewritten in place
by someone who can write the account's files (a group member, umask 002), an unsigned manifest
under ``trust = "strict"``, and what the account's own signed commit is worth.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from supervisor.adapters.checkpoints.commit import build_manifest, checksum_objects, commit_checkpoint, key_from_env
from supervisor.adapters.checkpoints.posix import PosixBackend
from supervisor.adapters.checkpoints.store import open_store
from supervisor.domain.checkpoints.manifest import MANIFEST_NAME, ChecksumAlgorithm, Level, Outcome, choose_resume
from supervisor.domain.checkpoints.signing import KEY_ENV, manifest_key
from supervisor.domain.run import Trust

KEY = manifest_key("the-run-token")
OTHER_UID = 2002  # the other tenant; no account needed: the kernel keeps the number
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another UID needs root")


def _save(root: Path, step: int, key: bytes | None, payload: bytes = b"weights") -> str:
    name = f"step_{step:06d}"
    (root / name).mkdir(parents=True)
    (root / name / "shard0").write_bytes(payload)
    backend = PosixBackend(str(root))
    commit_checkpoint(backend, name, build_manifest(backend, name, step, run="llm"), key=key)
    return name


def _resume(root: Path, trust: Trust = Trust.OWNER, level: Level = Level.FULL) -> tuple[str | None, dict[str, str]]:
    """(the checkpoint the next restart resumes from, each checkpoint's verification reason)."""
    store = open_store(str(root), key=KEY, trust=trust)
    refs = store.discover()
    results = {r.location: store.verify(r, level) for r in refs}
    choice = choose_resume(refs, results)
    return (choice.chosen.name if choice.chosen else None), {Path(k).name: v.reason for k, v in results.items()}


def _give_away(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, uid, -1, follow_symlinks=False)


@needs_root
@pytest.mark.parametrize("level", [Level.METADATA, Level.FULL])
def test_a_checkpoint_planted_by_another_account_is_not_resumed_from(tmp_path: Path, level: Level) -> None:
    _save(tmp_path, 100, KEY)
    planted = _save(tmp_path, 99_999_999, None, b"the attacker's weights")
    _give_away(tmp_path / planted, OTHER_UID)
    assert _resume(tmp_path, Trust.ANY, level)[0] == planted  # the code before issue 32: the attack works
    chosen, reasons = _resume(tmp_path, level=level)
    assert chosen == "step_000100"
    assert f"owned by uid {OTHER_UID}, not by the run's account" in reasons[planted]


@needs_root
def test_a_link_another_account_planted_among_the_accounts_files_is_theirs(tmp_path: Path) -> None:
    name = _save(tmp_path, 100, KEY)
    _save(tmp_path, 200, KEY)
    shard = tmp_path / "step_000200" / "shard0"
    shard.unlink()
    shard.symlink_to(tmp_path / name / "shard0")  # the same size; the account owns the target
    os.chown(shard, OTHER_UID, -1, follow_symlinks=False)
    chosen, reasons = _resume(tmp_path, level=Level.METADATA)
    assert chosen == name and "owned by uid 2002" in reasons["step_000200"]


def test_a_manifest_rewritten_by_someone_without_the_runs_key_is_refused(tmp_path: Path) -> None:
    """A group member who can write the account's files (umask 002) edits its newest manifest
    in place to point at shards of their own: the signature no longer matches."""
    _save(tmp_path, 100, KEY)
    name = _save(tmp_path, 200, KEY)
    (tmp_path / name / "evil").write_bytes(b"x" * 7)
    manifest_path = tmp_path / name / MANIFEST_NAME
    doc = json.loads(manifest_path.read_text())
    doc["shards"] = [{"key": "evil", "size": 7, "checksum": _checksum(tmp_path, name, "evil")}]
    manifest_path.write_text(json.dumps(doc))
    assert _resume(tmp_path, Trust.ANY)[0] == name  # without the signature check the edit goes unseen
    chosen, reasons = _resume(tmp_path)
    assert chosen == "step_000100"
    assert "signature does not match the run's key" in reasons[name]


def test_a_manifest_signed_with_another_runs_key_is_refused(tmp_path: Path) -> None:
    _save(tmp_path, 100, KEY)
    _save(tmp_path, 200, manifest_key("another run's token"))
    chosen, reasons = _resume(tmp_path)
    assert chosen == "step_000100" and "signature does not match" in reasons["step_000200"]


def test_unsigned_manifests_are_resumed_from_by_default_and_the_logbook_says_nobody_vouches(tmp_path: Path) -> None:
    _save(tmp_path, 100, None)
    chosen, reasons = _resume(tmp_path)
    assert chosen == "step_000100"
    assert "nobody vouches for its origin" in reasons["step_000100"]


def test_strict_trust_resumes_only_signed_manifests(tmp_path: Path) -> None:
    _save(tmp_path, 100, KEY)
    _save(tmp_path, 200, None)
    chosen, reasons = _resume(tmp_path, Trust.STRICT)
    assert chosen == "step_000100"
    assert reasons["step_000100"].endswith("signed")
    assert 'trust = "strict" needs a signed manifest' in reasons["step_000200"]


def test_strict_trust_refuses_files_group_or_others_may_write(tmp_path: Path) -> None:
    _save(tmp_path, 100, KEY)
    name = _save(tmp_path, 200, KEY)
    os.chmod(tmp_path / name / "shard0", 0o664)
    chosen, reasons = _resume(tmp_path, Trust.STRICT)
    assert chosen == "step_000100" and "writable by group or others (mode 0664)" in reasons[name]
    assert _resume(tmp_path, Trust.OWNER)[0] == name  # the default lets a umask-002 project space be


def test_strict_trust_refuses_adopted_layouts_which_carry_no_signature(tmp_path: Path) -> None:
    dcp = tmp_path / "step_000300"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"m")
    (dcp / "__0_0.distcp").write_bytes(b"d")
    chosen, reasons = _resume(tmp_path, Trust.OWNER)
    assert chosen == "step_000300" and "nobody vouches for its origin" in reasons["step_000300"]
    chosen, reasons = _resume(tmp_path, Trust.STRICT)
    assert chosen is None and 'trust = "strict" resumes only signed manifests' in reasons["step_000300"]


def test_the_trainers_commit_signs_with_the_key_the_daemon_handed_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY.hex())
    assert key_from_env() == KEY
    _save(tmp_path, 100, None)  # key=None: from SSV_MANIFEST_KEY
    assert json.loads((tmp_path / "step_000100" / MANIFEST_NAME).read_text())["mac"].startswith("hmac-sha256:")
    chosen, reasons = _resume(tmp_path, Trust.STRICT)
    assert chosen == "step_000100" and reasons["step_000100"].endswith("signed")
    monkeypatch.setenv(KEY_ENV, "not hex")
    with pytest.raises(ValueError, match="not hex"):
        key_from_env()


def test_a_signed_manifest_still_reads_where_signatures_are_not_checked(tmp_path: Path) -> None:
    """Backward compatible: the signature is one more field of format 1, ignored by a reader without the key."""
    _save(tmp_path, 100, KEY)
    store = open_store(str(tmp_path))
    (ref,) = store.discover()
    result = store.verify(ref, Level.FULL)
    assert result.outcome is Outcome.VERIFIED and "no key to check it" in result.reason


def _checksum(root: Path, name: str, key: str) -> str:
    backend = PosixBackend(str(root))
    info = backend.head(f"{name}/{key}")
    assert info is not None
    (entry,) = checksum_objects(backend, [info], ChecksumAlgorithm.CRC64NVME, strip=f"{name}/")
    return entry.checksum
