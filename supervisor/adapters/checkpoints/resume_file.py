"""The resume file: the chosen checkpoint written where the job's nodes can read it.

Written atomically (a temporary file in the same folder, fsync, rename), so a job starting while
the supervisor writes it reads the old plan or the new one, never half of one. Readable by the
job's user: mode 0644 (it names storage locations, never credentials).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_resume_file(path: str, text: str) -> None:
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
