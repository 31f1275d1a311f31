"""Finding 14 of the 2026-12-02 security review, documented as by design (docs/operations.md,
*Secrets per account*): whatever secret an instance uses, its account can read. ``read_secret``
takes a file only from the daemon's own account (or root) with mode 600, and the daemon runs as
the account, so a root-owned 0600 file that would hide a shared secret from the account is not
usable by its instance either, and one the instance can use is the account's to read."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from supervisor.adapters.secrets import read_secret

NOBODY = 65534
READ_AS_NOBODY = "from supervisor.adapters.secrets import read_secret; import sys; print(read_secret(sys.argv[1]))"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as two accounts")


def _as_nobody(argv: list[str]) -> subprocess.CompletedProcess[str]:
    drop = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    return subprocess.run(drop + argv, capture_output=True, text=True, timeout=30, check=False)


@pytest.fixture
def folder():
    # Not under pytest's tmp_path (root's, mode 700): nobody may look inside this one, and each
    # secret's own mode decides the rest.
    with tempfile.TemporaryDirectory(prefix="secret-") as name:
        os.chmod(name, 0o755)
        yield Path(name)


def test_a_root_owned_secret_is_not_usable_by_an_accounts_instance(folder):
    secret = folder / "site-wide-url"
    secret.write_text("https://hooks.example/site-wide\n")
    secret.chmod(0o600)
    done = _as_nobody([sys.executable, "-c", READ_AS_NOBODY, str(secret)])
    assert done.returncode != 0 and "cannot read it" in done.stderr
    assert "hooks.example" not in done.stderr + done.stdout  # refused without showing the secret


def test_the_secret_an_instance_uses_is_its_accounts_to_read(folder):
    secret = folder / "own-url"
    secret.write_text("https://hooks.example/own\n")
    secret.chmod(0o600)
    os.chown(secret, NOBODY, NOBODY)
    used = _as_nobody([sys.executable, "-c", READ_AS_NOBODY, str(secret)])
    assert used.returncode == 0, used.stderr
    read = _as_nobody(["cat", str(secret)])  # the account itself, outside the daemon
    assert used.stdout.strip() == read.stdout.strip() == "https://hooks.example/own"


def test_another_accounts_secret_is_refused(folder):
    secret = folder / "theirs"
    secret.write_text("https://hooks.example/theirs\n")
    secret.chmod(0o600)
    os.chown(secret, NOBODY, NOBODY)
    with pytest.raises(ValueError, match=f"belongs to uid {NOBODY}"):
        read_secret(secret)
