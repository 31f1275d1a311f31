"""The node guard (docs/guard.md): the one small service that holds node rights in Slurm.

Supervisor instances run as their owners and ask it, over a local Unix socket, to DOWN or DRAIN a
node. It identifies callers by SO_PEERCRED, grants a change only for a node of the caller's own
running job (or to an admin), applies the cluster-wide blast-radius cap, writes the Slurm reason
from its own template, audits every request, and remembers every instance's faults (the shared
quarantine). ``policy`` decides (pure), ``service`` acts, ``server`` speaks the socket,
``memory`` and ``audit`` keep what it must keep, ``config`` reads ``guard.toml``.
"""
