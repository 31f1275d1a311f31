"""What crosses the network for a run's token, and the daemon's signature on a launcher's goal.

Without TLS (the default) everything on the ingest's port can be read on the cluster network. So
the run's token itself never crosses it: agents and launchers send ``wire_token(token)``, a
one-way derivative, and the ingest accepts it (and, from clients older than this rule, the token
itself). Whoever reads a request learns the wire token, which lets it send reports as the run
does (as before: use TLS against that), but not the token, so not the keys derived from it: the
manifests' (``checkpoints.signing``) and the goal's below (issue 32, finding 9).

The daemon's answer to the in-allocation launcher names the nodes and the checkpoint of the next
step; it carries ``goal_mac``, an HMAC-SHA256 under a key derived from the run's token over the
run's name and the goal's fields, and the launcher acts only on a goal whose MAC is the run's.
Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence

WIRE_PREFIX = "ssv1."  # a token with this prefix is a wire token (run tokens are urlsafe base64: no '.')
_WIRE_CONTEXT = b"slurm-supervisor wire token v1"
_GOAL_CONTEXT = b"slurm-supervisor launcher goal v1"
SCHEME = "hmac-sha256"


def wire_token(token: str) -> str:
    """What a client sends for ``token``: the token never crosses the network itself."""
    return WIRE_PREFIX + hmac.new(token.encode(), _WIRE_CONTEXT, hashlib.sha256).hexdigest()


def speaks_for(sent: str, token: str) -> bool:
    """Does the bearer ``sent`` speak for ``token`` (its wire token, or the token itself from an
    older client)? Constant-time either way."""
    expected = wire_token(token) if sent.startswith(WIRE_PREFIX) else token
    return hmac.compare_digest(sent.encode(), expected.encode())


def goal_mac(
    token: str, run: str, job_id: int, generation: int, nodes: Sequence[str] | None, env: Mapping[str, str]
) -> str:
    """The daemon's signature on a launcher's goal (every field of it, and the run it is for)."""
    key = hmac.new(token.encode(), _GOAL_CONTEXT, hashlib.sha256).digest()
    fields = [run, job_id, generation, None if nodes is None else list(nodes), sorted(env.items())]
    body = json.dumps(fields, separators=(",", ":"), ensure_ascii=True).encode()
    return f"{SCHEME}:{hmac.new(key, body, hashlib.sha256).hexdigest()}"
