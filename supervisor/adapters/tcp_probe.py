"""Direct liveness probe of slurmd: a TCP connect to each node's slurmd port, all at once.

A refused connection means nothing listens (slurmd is dead); a connect that does not finish
within the timeout means the host does not answer. Either is one failed probe; the engine calls
a node dead only after failures spanning its confirmation time. Cost: one non-blocking connect per
node per tick, no RPC to slurmctld.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
from collections.abc import Iterable, Mapping

from supervisor.domain.cluster import NodeInfo

DEFAULT_SLURMD_PORT = 6818


class TcpProbe:
    def __init__(self, timeout: float = 1.0, default_port: int = DEFAULT_SLURMD_PORT) -> None:
        self.timeout = timeout
        self.default_port = default_port

    def probe(self, nodes: Iterable[NodeInfo]) -> Mapping[str, str | None]:
        results: dict[str, str | None] = {}
        sel = selectors.DefaultSelector()
        try:
            for node in nodes:
                self._start(node, sel, results)
            self._finish(sel, results)
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()
        return results

    def _start(self, node: NodeInfo, sel: selectors.BaseSelector, results: dict[str, str | None]) -> None:
        addr = (node.address or node.name, node.port or self.default_port)
        try:
            info = socket.getaddrinfo(addr[0], addr[1], type=socket.SOCK_STREAM)[0]
        except OSError as exc:
            results[node.name] = f"cannot resolve {addr[0]}: {exc}"
            return
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setblocking(False)
        rc = sock.connect_ex(info[4])
        if rc in (0, errno.EINPROGRESS):
            sel.register(sock, selectors.EVENT_WRITE, (node.name, f"{addr[0]}:{addr[1]}"))
        else:
            sock.close()
            results[node.name] = f"connect to {addr[0]}:{addr[1]}: {errno.errorcode.get(rc, rc)}"

    def _finish(self, sel: selectors.BaseSelector, results: dict[str, str | None]) -> None:
        deadline = time.monotonic() + self.timeout
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in sel.select(left):
                name, where = key.data
                err = key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # type: ignore[union-attr]
                results[name] = None if err == 0 else f"connect to {where}: {errno.errorcode.get(err, err)}"
                sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]
        for key in list(sel.get_map().values()):
            name, where = key.data
            results[name] = f"connect to {where}: no answer within {self.timeout:.1f} s"
