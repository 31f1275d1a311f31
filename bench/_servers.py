"""The two well-kept servers the daemon's hand-written one was measured against (ADR 0003), each a
minimal app around the same ``Router`` and ``ReportIngest`` (``bench/ingest.py --server``):

* ``uvicorn``: uvicorn 0.3x with a minimal ASGI app (``http="httptools"``, ``loop="uvloop"`` or
  ``"asyncio"``, ``limit_concurrency``, ``lifespan="off"``, no access log);
* ``aiohttp``: aiohttp's low-level server (``aiohttp.web.Server`` with one handler, its C parser,
  ``max_line_size``/``max_field_size``).

Both run on their own thread and loop, like ``HttpServer``. They are here to be measured, not used
by the daemon; ``uvicorn``, ``aiohttp`` and ``uvloop`` are not dependencies of the package
(``pip install uvicorn aiohttp uvloop`` to run them).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from supervisor.adapters.web.messages import answer
from supervisor.adapters.web.server import Request, Response, Router, error


class _Threaded:
    """Runs ``serve(loop, ready)`` on a thread of its own; ``port`` is set before ``start`` returns."""

    def __init__(self, router: Router, host: str = "127.0.0.1", port: int = 0) -> None:
        self.router, self.host, self.port = router, host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._pages = ThreadPoolExecutor(max_workers=1)

    async def answer(self, request: Request) -> Response:
        """As ``HttpServer``: the gate on the loop, blocking routes (pages) on one worker thread."""
        route = self.router.find(request.path)
        if route is None:
            return error(404, "no such path")
        refused = route.gate(request) if route.gate is not None else None
        if refused is not None:
            return refused
        if not route.blocking:
            return answer(route, request)
        return await asyncio.get_running_loop().run_in_executor(self._pages, answer, route, request)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bench-server", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        raise NotImplementedError


class UvicornServer(_Threaded):
    def __init__(self, router: Router, host: str = "127.0.0.1", port: int = 0, loop: str = "uvloop") -> None:
        super().__init__(router, host, port)
        self.loop_name = loop

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        client = scope.get("client") or ("?", 0)
        request = Request(
            scope["method"], scope["path"], scope["query_string"].decode("latin-1"), headers, b"".join(chunks),
            f"{client[0]}:{client[1]}",
        )  # fmt: skip
        response = await self.answer(request)
        head = [(b"content-type", response.content_type.encode()), (b"content-length", b"%d" % len(response.body))]
        head += [(k.encode(), v.encode()) for k, v in response.headers.items()]
        await send({"type": "http.response.start", "status": response.status, "headers": head})
        await send({"type": "http.response.body", "body": response.body})

    def _run(self) -> None:
        import socket

        import uvicorn

        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, interface="asgi3", http="httptools", loop=self.loop_name, lifespan="off", access_log=False, log_config=None,
            limit_concurrency=2000, timeout_keep_alive=75, server_header=False, date_header=False,
        )  # fmt: skip
        server = uvicorn.Server(config)
        loop = asyncio.new_event_loop() if self.loop_name == "asyncio" else _uvloop()
        self._loop = loop
        self._ready.set()
        try:
            loop.run_until_complete(server.serve(sockets=[sock]))
        except RuntimeError:
            pass  # stopped from stop(): "Event loop stopped before Future completed"


def _uvloop() -> asyncio.AbstractEventLoop:
    import uvloop

    return uvloop.new_event_loop()


class AiohttpServer(_Threaded):
    def __init__(self, router: Router, host: str = "127.0.0.1", port: int = 0, loop: str = "asyncio") -> None:
        super().__init__(router, host, port)
        self.loop_name = loop

    async def handler(self, raw: Any) -> Any:
        from aiohttp import web

        body = await raw.read()
        peer = raw.transport.get_extra_info("peername") if raw.transport else None
        request = Request(raw.method, raw.path, raw.query_string, {k.lower(): v for k, v in raw.headers.items()},
                          body, str(peer))  # fmt: skip
        response = await self.answer(request)
        return web.Response(body=response.body, status=response.status, headers={
            "Content-Type": response.content_type, **response.headers})  # fmt: skip

    def _run(self) -> None:
        from aiohttp import web

        loop = asyncio.new_event_loop() if self.loop_name == "asyncio" else _uvloop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def listen() -> asyncio.AbstractServer:
            server = web.Server(self.handler, max_line_size=2048, max_field_size=8190, keepalive_timeout=75)
            return await loop.create_server(server, self.host, self.port, reuse_address=True)

        listener = loop.run_until_complete(listen())
        self.port = listener.sockets[0].getsockname()[1]
        self._ready.set()
        loop.run_forever()


SERVERS = {"uvicorn": UvicornServer, "aiohttp": AiohttpServer}
