"""A server in a network namespace of its own, each client reaching it over a veth link of its own:
one client's link can be cut (its packets dropped) while the others' stay up (issue 33: a leader
partitioned from the database).

    with ServerNet(links=2) as net:
        server argv: [*net.exec_prefix, "postgres", ...] listening on net.server_address(0) and (1)
        client 0 connects to net.server_address(0); net.cut(0) drops its packets; net.heal(0)

``cut`` adds a blackhole route on each side of the link: packets of established connections are
dropped silently (a client waits for its timeouts, as behind a dead switch), new connections are
refused at once. Needs root and ``ip`` (iproute2); ``unavailable_reason()`` says why not.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess

IP = "ip"


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which(IP) is None:
        return "no ip (iproute2)"
    return None


class ServerNet:
    """A namespace ``ssvNNNN`` with ``links`` veth pairs to the host: link i is 10.A.B.1 (host side,
    the client's) to 10.A.B.2 (the server's side), a /30 each, A and B chosen at random."""

    def __init__(self, links: int = 2) -> None:
        token = secrets.randbelow(1 << 16)
        self.name = f"ssv{token:04x}"
        self._net = (100 + secrets.randbelow(150), secrets.randbelow(60) * 4)
        self.links = links
        self._up = False

    @property
    def exec_prefix(self) -> list[str]:
        return [IP, "netns", "exec", self.name]

    def client_address(self, link: int) -> str:
        return self._address(link, 1)

    def server_address(self, link: int) -> str:
        return self._address(link, 2)

    def _address(self, link: int, host: int) -> str:
        a, b = self._net
        return f"10.{a}.{b + link // 60}.{(link % 60) * 4 + host}"

    def _dev(self, link: int, side: str) -> str:
        return f"{self.name}{side}{link}"

    def start(self) -> ServerNet:
        _ip("netns", "add", self.name)
        self._up = True
        _ip("-n", self.name, "link", "set", "lo", "up")
        for link in range(self.links):
            host, peer = self._dev(link, "h"), self._dev(link, "p")
            _ip("link", "add", host, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", self.name)
            _ip("addr", "add", f"{self.client_address(link)}/30", "dev", host)
            _ip("link", "set", host, "up")
            _ip("-n", self.name, "addr", "add", f"{self.server_address(link)}/30", "dev", peer)
            _ip("-n", self.name, "link", "set", peer, "up")
        return self

    def cut(self, link: int) -> None:
        """Drop every packet on ``link``, both ways."""
        _ip("route", "add", "blackhole", f"{self.server_address(link)}/32")
        _ip("-n", self.name, "route", "add", "blackhole", f"{self.client_address(link)}/32")

    def heal(self, link: int) -> None:
        _ip("route", "del", "blackhole", f"{self.server_address(link)}/32")
        _ip("-n", self.name, "route", "del", "blackhole", f"{self.client_address(link)}/32")

    def stop(self) -> None:
        if not self._up:
            return
        for link in range(self.links):
            subprocess.run([IP, "route", "del", "blackhole", f"{self.server_address(link)}/32"], capture_output=True)  # noqa: S603
            subprocess.run([IP, "link", "del", self._dev(link, "h")], capture_output=True)  # noqa: S603
        subprocess.run([IP, "netns", "del", self.name], capture_output=True)  # noqa: S603
        self._up = False

    def __enter__(self) -> ServerNet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _ip(*args: str) -> None:
    done = subprocess.run([IP, *args], capture_output=True, text=True, timeout=10, check=False)  # noqa: S603
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
