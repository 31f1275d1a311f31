"""``python -m supervisor.testing.servers._moto_main --port N``: moto's S3 server, plus one test-only door.

The server is moto's own (``moto.server``'s WSGI app under werkzeug, threaded), run as a
subprocess so that a benchmark measures the server and the client on their own interpreters.
The extra door, ``POST /_ssv_at_rest?bucket=B&key=K&op=flip&offset=N`` (or ``op=truncate&size=N``),
changes an object's stored bytes inside moto's backend without the S3 API: the ETag, the stored
checksums and the recorded size stay those of the original, as with corruption at rest on a real
server. It answers 204, or 404 when there is no such object.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

AT_REST_PATH = "/_ssv_at_rest"


def _alter(bucket: str, key: str, op: str, number: int) -> bool:
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    found = backend.buckets.get(bucket)
    obj = found.keys.get(key) if found is not None else None
    if obj is None:
        return False
    with obj.lock:
        buf = obj._value_buffer
        if op == "flip":
            buf.seek(number)
            byte = buf.read(1)
            buf.seek(number)
            buf.write(bytes([byte[0] ^ 0x01]))
        elif op == "truncate":
            buf.truncate(number)  # contentsize (what HEAD and listings say) is left as it was
        else:
            raise ValueError(op)
    return True


def at_rest_door(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != AT_REST_PATH:
            return app(environ, start_response)
        q = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        number = int(q.get("offset", q.get("size", "0")))
        done = _alter(q["bucket"], q["key"], q.get("op", "flip"), number)
        start_response("204 No Content" if done else "404 Not Found", [("Content-Length", "0")])
        return [b""]

    return wrapped


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, at_rest_door(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
