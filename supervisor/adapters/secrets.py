"""Secrets read from files: the webhook URL, PagerDuty's routing key, the hooks' token.

A secret file must belong to the daemon's own user (or root), give no permission to its group or
others (mode 600 or stricter), and hold the secret on its first line. Errors are ``ValueError``s
that name the setting, the file and the fix; the secret itself never appears in them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def read_secret(path: str | Path, what: str = "webhook_url_file", section: str = "notify") -> str:
    """The secret in ``path`` (the ``[section] what`` setting), once its owner and mode are checked."""
    p = Path(path)
    where = f"[{section}] {what} = {str(p)!r}"
    try:
        info = p.stat()
        text = p.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ValueError(f"{where}: cannot read it ({why}); create it with the secret on one line, mode 600") from None
    if info.st_uid not in (os.geteuid(), 0):
        raise ValueError(f"{where} belongs to uid {info.st_uid}, not to this daemon's user nor root; chown it")
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{where} is readable by others (mode {stat.S_IMODE(info.st_mode):o}); run `chmod 600 {p}`")
    if not text:
        raise ValueError(f"{where} is empty; write the secret into it")
    return text
