"""Which peer a connection counts against, for the listener's per-peer cap (issue 32, finding 5).

An address is a peer, except where one person can speak from many addresses at once: every
loopback address (``127.0.0.0/8``, ``::1``, and IPv4-mapped ones) is one peer, since any user of
the login node may bind any ``127.x.y.z`` as a source (also to reach the login node's cluster
address); an IPv6 address counts by its /64, which one host is usually given whole. Addresses in
``node_networks`` (``[ingest] node_networks``: the compute nodes' subnets) count one by one
whatever they are: that is where the runs' own agents come from.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from functools import lru_cache

LOOPBACK = "loopback"
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=16)
def _networks(texts: tuple[str, ...]) -> tuple[_Network, ...]:
    return tuple(ipaddress.ip_network(t, strict=False) for t in texts)


def peer_key(ip: str, node_networks: Sequence[str] = ()) -> str:
    """The peer ``ip`` counts against (module docstring); a text that is no address is its own."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if node_networks and any(addr in net for net in _networks(tuple(node_networks))):
        return str(addr)
    if addr.is_loopback:
        return LOOPBACK
    if isinstance(addr, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{addr}/64", strict=False))
    return str(addr)
