"""The tokens the ingest accepts: the runs' from the store, the hooks' from a secret file that is
checked like every other secret (owner and mode; security review finding #16)."""

from __future__ import annotations

import os

import pytest
from structlog.testing import capture_logs

from supervisor.adapters.web.tokens import HOOKS, TokenBook


class Ticks:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def secret(tmp_path, text: str = "hook-token-0123456789", mode: int = 0o600):
    path = tmp_path / "hook.token"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_run_tokens_and_the_hook_token(tmp_path):
    book = TokenBook(lambda: {"llm": "run-token"}, hook_token_file=str(secret(tmp_path)))
    assert dict(book) == {"llm": "run-token", HOOKS: "hook-token-0123456789"}


@pytest.mark.parametrize(("mode", "text", "fix"), [(0o644, "t", "chmod 600"), (0o600, "", "is empty")])
def test_a_hook_token_file_others_may_read_is_refused_at_start(tmp_path, mode, text, fix):
    with pytest.raises(ValueError, match=fix) as caught:
        TokenBook(dict, hook_token_file=str(secret(tmp_path, text, mode)))
    assert "[ingest] hook_token_file" in str(caught.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away takes root")
def test_a_hook_token_file_of_another_user_is_refused(tmp_path):
    path = secret(tmp_path)
    os.chown(path, 4321, 4321)
    with pytest.raises(ValueError, match="belongs to uid 4321"):
        TokenBook(dict, hook_token_file=str(path))


def test_a_hook_token_file_that_turns_unsafe_is_dropped_loudly(tmp_path):
    path, ticks = secret(tmp_path), Ticks()
    book = TokenBook(dict, hook_token_file=str(path), refresh_s=1.0, monotonic=ticks)
    assert HOOKS in book
    path.chmod(0o644)
    ticks.t = 5.0
    with capture_logs() as logs:
        assert HOOKS not in book
        ticks.t = 10.0
        assert HOOKS not in book
    assert [e["event"] for e in logs] == ["hook_token_refused"]  # said once, not at every refresh
    assert "chmod 600" in logs[0]["error"] and "hook-token" not in str(logs)
    path.chmod(0o600)
    ticks.t = 15.0
    assert book[HOOKS] == "hook-token-0123456789"
