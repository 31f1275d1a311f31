"""The daemon's URL as a node agent or a launcher is given it: checked once, and the path of a
run's endpoint under it (the run's name quoted: it reaches the path as one segment).

With daemons of one instance on several login nodes (issue 33) a job is given every one's URL,
comma-separated, the submitting leader's first (``SLURM_SUPERVISOR_URL``): a launcher polls the
first that answers as the leader (``launcher_client``); a node agent or a hook sends its reports to
the one that took its last batch, and to the next when that one does not answer or stands by (503;
``sender``)."""

from __future__ import annotations

import urllib.parse

MAX_URLS = 8  # login nodes of one instance: a few; a longer list is a mistake, not a cluster
MAX_URL_CHARS = 2048


def run_endpoint(url: str, prefix: str, run: str) -> tuple[urllib.parse.SplitResult, str]:
    """``url`` split, and the path of ``run``'s endpoint under ``prefix`` (e.g. ``/v1/reports/``)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"daemon URL {url!r} must look like http://HOST:PORT")
    return parsed, f"{parsed.path.rstrip('/')}{prefix}{urllib.parse.quote(run, safe='')}"


def daemon_urls(text: str) -> tuple[str, ...]:
    """The URLs of ``text`` (one, or several comma-separated), each checked; ValueError says which."""
    if len(text) > MAX_URLS * MAX_URL_CHARS:
        raise ValueError(f"the daemon URL list is {len(text)} characters long; give at most {MAX_URLS} URLs")
    urls = tuple(part.strip() for part in text.split(",") if part.strip())
    if not urls or len(urls) > MAX_URLS:
        raise ValueError(f"give one to {MAX_URLS} daemon URLs, comma-separated (got {len(urls)})")
    for url in urls:
        run_endpoint(url, "/", "x")  # raises for a URL that is not one
    return urls
