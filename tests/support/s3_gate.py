"""An HTTP proxy in front of the tests' S3 server that holds one write request in flight.

A writer that stalls between choosing a log version and its PUT reaching the store (a long GC
pause, a slow network, a paused VM) is the race a commit must survive. The proxy makes that
stall exact and independent of how the writer builds its request: the first PUT or POST to a
key matching ``pattern`` is held, before it reaches the server, until ``release``; every other
request passes straight through.
"""

from __future__ import annotations

import http.client
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from airflow_pglogrepl.lake.storage import ObjectStore

__all__ = ["Answer", "HeldWrite", "s3_error"]

# A request's answer of the test's own: (status, body), or None for the server's
Answer = Callable[[str, str], tuple[int, bytes] | None]


def s3_error(code: str, message: str, **more: str) -> bytes:
    """An S3 error document, as the store sends one."""
    extra = "".join(f"<{k}>{v}</{k}>" for k, v in more.items())
    return f"<Error><Code>{code}</Code><Message>{message}</Message>{extra}</Error>".encode()


_CONDITIONS = {"if-none-match", "if-match"}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}


class HeldWrite:
    """A proxy to ``store``'s endpoint holding the first write to a key matching ``pattern``.

    ``store`` is the same store seen through the proxy; ``held`` is set once the write is held
    (wait on it: it is the writer's stall), ``release`` lets it go on to the server.
    ``strip_conditions``: the proxy drops ``If-None-Match`` and ``If-Match``, as a store that
    ignores conditional writes would. ``answer(method, path)`` may give a request an answer of
    its own, ``(status, body)``, instead of the server's (None: the server's).
    """

    def __init__(self, target: ObjectStore, pattern: str = r"(?!)", *,
                 strip_conditions: bool = False, answer: Answer | None = None) -> None:  # fmt: skip
        assert target.endpoint_url is not None
        upstream = urlsplit(target.endpoint_url)
        self._pattern = re.compile(pattern)
        self._released = threading.Event()
        self._claimed = threading.Lock()
        self._holding = False
        self.held = threading.Event()
        self.held_path = ""
        gate = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                own = answer(self.command, urlsplit(self.path).path) if answer else None
                if own is not None:
                    self.send_response(own[0])
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(own[1])))
                    self.end_headers()
                    self.wfile.write(own[1])
                    return
                if self.command in ("PUT", "POST") and gate._take(self.path):
                    gate.held_path = self.path
                    gate.held.set()
                    gate._released.wait(60)
                upstream_conn = http.client.HTTPConnection(upstream.hostname or "127.0.0.1",
                                                           upstream.port, timeout=60)  # fmt: skip
                dropped = _HOP_BY_HOP | (_CONDITIONS if strip_conditions else set())
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in dropped}  # fmt: skip
                upstream_conn.request(self.command, self.path, body=body, headers=headers)
                reply = upstream_conn.getresponse()
                data = reply.read()
                self.send_response(reply.status, reply.reason)
                for key, value in reply.getheaders():
                    if key.lower() not in _HOP_BY_HOP and key.lower() != "content-length":
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                upstream_conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        self.store = ObjectStore(
            endpoint_url=f"http://{host!s}:{port}", region=target.region,
            access_key_id=target.access_key_id, secret_access_key=target.secret_access_key,
        )  # fmt: skip

    def _take(self, path: str) -> bool:
        """Whether this write is the one to hold (the first that matches)."""
        with self._claimed:
            if self._holding or not self._pattern.search(urlsplit(path).path):
                return False
            self._holding = True
            return True

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
