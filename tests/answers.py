"""Reading a server's whole answer off a socket, as the hostile and HTTP tests do."""

from __future__ import annotations

import socket


def read_answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes; a reset ends the answer too (a server may hang
    up hard on garbage). A timeout propagates: a server that neither answers nor closes hangs."""
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer
