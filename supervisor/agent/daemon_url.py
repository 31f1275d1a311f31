"""The daemon's URL as a node agent or a launcher is given it: checked once, and the path of a
run's endpoint under it (the run's name quoted: it reaches the path as one segment)."""

from __future__ import annotations

import urllib.parse


def run_endpoint(url: str, prefix: str, run: str) -> tuple[urllib.parse.SplitResult, str]:
    """``url`` split, and the path of ``run``'s endpoint under ``prefix`` (e.g. ``/v1/reports/``)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"daemon URL {url!r} must look like http://HOST:PORT")
    return parsed, f"{parsed.path.rstrip('/')}{prefix}{urllib.parse.quote(run, safe='')}"
