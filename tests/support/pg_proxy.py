"""A TCP proxy in front of a PostgreSQL server, for the tests of what a client sees through one.

It can report another backend PID than the server's (``fake_pid``: the BackendKeyData message
rewritten, as PgBouncer reports its own), refuse connections until it is opened (``listening``:
the port is bound but not listened on, so a connection is refused at once, as by a server that
is down), and cut every connection it carries (``cut``: a clean close, as a server that went
away). A client that wants its PID rewritten connects with ``sslmode=disable`` and
``gssencmode=disable``: the proxy reads the server's messages in clear. ``frozen_endpoint`` is
a server that accepts connections and never answers (a frozen host: SIGSTOP, a hung VM), and
``error_within`` what a call against one raised, in a bounded time.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Iterator

__all__ = ["PgProxy", "error_within", "frozen_endpoint", "pg_proxy"]


class PgProxy:
    """Forwards every connection to ``target`` (host, port); ``port`` is where it listens."""

    def __init__(
        self, target: tuple[str, int], *, fake_pid: int | None = None, listening: bool = True
    ) -> None:
        self.target = target
        self.fake_pid = fake_pid
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        self._accepting: threading.Thread | None = None
        if listening:
            self.listen()

    def listen(self) -> None:
        """Accept connections from now on."""
        self._server.listen(16)
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def cut(self) -> None:
        """Close every connection it carries, both ways (the client reads an end of file)."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        if self._accepting is not None:
            self._accepting.join(5)
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, None), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(server, client, self.fake_pid), daemon=True
            ).start()

    def _pump(self, source: socket.socket, sink: socket.socket, fake_pid: int | None) -> None:
        """Copy ``source`` to ``sink``; with ``fake_pid``, the server's messages are read one at
        a time until its BackendKeyData, whose PID is replaced."""
        pending = b""
        try:
            while data := source.recv(65536):
                if fake_pid is not None:
                    pending += data
                    data, pending, fake_pid = _rewrite_pid(pending, fake_pid)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)


def _rewrite_pid(pending: bytes, fake_pid: int) -> tuple[bytes, bytes, int | None]:
    """The whole messages of ``pending`` to send (BackendKeyData's PID replaced), the partial
    rest, and the PID still to put in (None once done: the rest passes as it is)."""
    out = bytearray()
    while len(pending) >= 5:
        kind, length = pending[:1], struct.unpack("!i", pending[1:5])[0]
        if len(pending) < 1 + length:
            break
        message, pending = bytearray(pending[: 1 + length]), pending[1 + length :]
        if kind == b"K":
            message[5:9] = struct.pack("!i", fake_pid)
            return bytes(out + message) + pending, b"", None
        out += message
    return bytes(out), pending, fake_pid


@contextlib.contextmanager
def pg_proxy(
    target: tuple[str, int], *, fake_pid: int | None = None, listening: bool = True
) -> Iterator[PgProxy]:
    proxy = PgProxy(target, fake_pid=fake_pid, listening=listening)
    try:
        yield proxy
    finally:
        proxy.close()


@contextlib.contextmanager
def frozen_endpoint() -> Iterator[int]:
    """A port on 127.0.0.1 whose connections the kernel accepts and nobody reads: a client's
    startup packet is never answered. Closing it resets them (a client still waiting ends)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


def error_within(call: Callable[[], object], timeout_s: float) -> BaseException:
    """Run ``call`` in a thread; the error it raised within ``timeout_s`` (a test that hangs
    instead fails, naming it)."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            caught.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"still running after {timeout_s:.0f} s"
    assert caught, "it raised nothing"
    return caught[0]
