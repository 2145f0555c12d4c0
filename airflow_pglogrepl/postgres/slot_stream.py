"""A logical slot read through the streaming replication protocol (``START_REPLICATION``).

A peek (``pg_logical_slot_peek_binary_changes``) decodes from the slot's ``restart_lsn`` on
every call and sends nothing until its whole result is materialized. A stream decodes each WAL
record once and sends every transaction as soon as its commit is decoded, so the server
decodes while the drain writes. psycopg has no replication API; its ``pq`` layer has the
COPY BOTH calls this needs, and the frames are ``stream_frames``' work.

One reader thread owns the connection: it reads frames, hands them over in batches through a
bounded queue (``batches``), answers the walsender's keepalives and sends status updates. The
flushed position it reports is only ever what ``confirm`` was given, the lake's committed
position, so the slot's ``confirmed_flush_lsn`` never passes what the lake holds. While the
consumer is busy and the queue full, the reader reads one batch's bytes further
(``frame_queue``: a server shutting down is heard asking), then stops reading but still
reports on time: a walsender ends a client it has not heard from within ``wal_sender_timeout``.

Silence is judged by what the server may do (``walsender.Silence``): a walsender decoding a
transaction that sends nothing is waited for while a session of its own finds it holding the
slot, for as long as a healthy one may stay silent; one gone from the slot, stuck, or a server
out of reach ends the stream. A stream never leaves its walsender holding the slot as it
closes, however it ended (``walsender.release``), and says whether it did (``slot_free``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import select
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psycopg
from psycopg import pq

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import PgLogReplError, SlotStreamError
from airflow_pglogrepl.identifiers import validate_slot_name
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.postgres.connect import server_of
from airflow_pglogrepl.postgres.errors import slot_errors
from airflow_pglogrepl.postgres.frame_queue import FrameQueue
from airflow_pglogrepl.postgres.stream_frames import (
    FrameBatch,
    frames,
    start_replication,
    status_update,
)
from airflow_pglogrepl.postgres.walsender import (
    Silence,
    backend_pid,
    brief,
    open_walsender,
    refuse_synchronous_standby,
    release,
    side_params,
)

__all__ = ["BATCH_BYTES", "SlotStream"]

log = logging.getLogger("airflow_pglogrepl.stream")

BATCH_BYTES = 4 << 20  # frames handed over at a time, as a peek's Arrow batches
QUEUED_BATCHES = 4  # batches read ahead of the consumer
# A batch is handed over once it holds BATCH_BYTES, or once no more frames are waiting and it
# holds GATHER_BYTES or its first frame came GATHER_S ago: a server that sends a little at a
# time would otherwise make a batch of every few frames, and each costs the decoder a call.
GATHER_BYTES = 256 << 10
GATHER_S = 0.1
WAKE_BYTES = 32 << 10  # the socket wakes the reader for this much (SO_RCVLOWAT)
# Seconds to wait for the server to end the stream after our CopyDone before cutting it off. A
# healthy walsender answers in milliseconds; one decoding a transaction that sends nothing reads
# our CopyDone only at its next look at the socket, up to half its wal_sender_timeout away.
# Past this, ``release`` ends it and the caller confirms the slot with an advance (``close``
# returns False): cutting off early costs that advance, which decodes from restart_lsn to the
# confirmed position (long only behind a transaction open across it), instead of up to 30 s.
CLOSE_TIMEOUT_S = 5.0
# Reply requests this close together are a walsender's shutdown, not its timeout (see
# ``_check_stopping``).
STOPPING_REQUESTS, STOPPING_WITHIN_S = 3, 1.0


class _StoppedError(Exception):
    """The consumer closed the stream."""


class SlotStream:
    """``START_REPLICATION SLOT slot LOGICAL start`` with pgoutput's ``options``, read in a
    thread of its own (see the module's docstring). Use as a context manager, or ``close``.

    ``alive`` is called in the reader's thread while a busy consumer leaves the queue full,
    once per status interval; when it raises, the stream ends with its error. The drain passes
    its writer lock's check: a fast shutdown of the server ends that lock's session at once,
    while the walsender waits, before it exits, for a confirm the lake cannot give yet and
    for us to read what it still has to send (which a full queue stops us from doing).

    ``walsender_pid`` is the PID of the stream's walsender, asked of the server: the slot's
    ``active_pid`` while it streams. ``slot_free`` is None until ``close``, then whether the
    walsender was seen to let go of the slot (False: it still holds it, or the server could
    not be asked): a peek of the slot can follow only when it is True.

    :raises SlotStreamUnavailableError: the server refused the replication connection.
    Errors on the slot (missing, in use, a publication missing) are raised as the peek raises
    them, from the constructor or from ``batches``; a stream that ends early raises
    ``SlotStreamError``.
    """

    def __init__(
        self,
        params: dict[str, str],
        slot: str,
        *,
        label: str,
        start: LSN | int,
        options: Mapping[str, str],
        batch_bytes: int = BATCH_BYTES,
        alive: Callable[[], object] | None = None,
    ) -> None:
        validate_slot_name(slot)
        self._alive = alive
        self.slot = slot
        self.start = LSN(start)
        self.batch_bytes = batch_bytes
        self._flushed = int(self.start)  # what ``confirm`` was given: the lake's position
        self._received = int(self.start)
        self._sent_flush = -1
        self._sent_at = 0.0
        self._asked: list[float] = []  # when the server asked us to reply at once, lately
        self._heard_at = time.monotonic()  # when a frame last came
        self._ended_cleanly = False
        self.slot_free: bool | None = None  # set by ``close``
        self._closed = False
        self._frames = FrameQueue(
            QUEUED_BATCHES, ahead_bytes=batch_bytes, waiting=self._reader_waits, wait_s=1.0
        )
        self._stop = threading.Event()
        self._secrets = conninfo.secrets_of(params)
        self._label = label  # for the sessions beside the stream
        self._conn = open_walsender(params, slot, label=label)
        self._started = False  # START_REPLICATION accepted: the walsender may hold the slot
        self._wake_r = self._wake_w = -1
        self._low_water = False
        try:
            # The walsender is this connection's backend: the process that will hold the slot.
            self.walsender_pid = backend_pid(self._conn)
            # Side sessions go to the server this connection reached, whatever params list.
            self._side = side_params(params, self._conn)
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_r, False)
            self._server = server_of(self._conn)
            self._silence = Silence.of(self._conn, self._side, slot, self.walsender_pid,
                                       label=label, secrets=self._secrets)  # fmt: skip
            self._interval = self._silence.interval
            self._frames.wait_s = min(self._interval, 1.0)
            # the options the stream was started with (read by its decoder): ``streaming``
            # needs protocol 2, which servers before 14 do not have
            self.options = dict(options)
            if self._conn.info.server_version < 140000 and "streaming" in self.options:
                self.options.pop("streaming")
                self.options["proto_version"] = "1"
            refuse_synchronous_standby(self._conn, slot)
            command = start_replication(slot, self.start, self.options, self._conn)
            self._begin(command)
            self._started = True
            self._low_water = _wake_for_bytes(self._conn.pgconn.socket, WAKE_BYTES)
        except BaseException:
            self._conn.close()
            self._close_pipe()
            self._release()
            raise
        self._thread = threading.Thread(target=self._run, name=f"slot-stream-{slot}", daemon=True)
        self._thread.start()

    # -- the consumer's side ------------------------------------------------------------------

    def batches(self) -> Iterator[FrameBatch]:
        """The frames as they come, a batch at a time, until ``close`` (or an error, raised)."""
        for batch in self.batches_or_idle(None):
            if batch is not None:
                yield batch

    def batches_or_idle(self, idle_s: float | None) -> Iterator[FrameBatch | None]:
        """As ``batches``, and None whenever no batch came for ``idle_s`` seconds: a consumer
        that acts on time (a following drain) is woken though the source is quiet."""
        while True:
            try:
                item = self._frames.get(idle_s)
            except queue.Empty:
                yield None
                continue
            if self._frames.pending:
                self._wake()  # a batch waits for the room this take made
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def confirm(self, lsn: LSN | int) -> None:
        """The lake holds every transaction that commits before ``lsn``: the slot may forget
        them. Sent to the server at once; never lowered."""
        self._flushed = max(self._flushed, int(lsn))
        self._wake()

    def close(self) -> bool:
        """Report the confirmed position a last time and end the stream, and see the slot
        free of its walsender, however the stream ended (``_release``; ``slot_free`` says
        whether it is). False: the stream had already ended (its error was not read) or the
        server did not answer, so the last confirm may not have reached it."""
        if not self._closed:
            self._closed = True
            self._stop.set()
            self._wake()
            self._thread.join()
            self._close_pipe()
            self.slot_free = self._release()
        return self._ended_cleanly

    def __enter__(self) -> SlotStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the reader thread ----------------------------------------------------------------------

    def _begin(self, command: bytes) -> None:
        """Send START_REPLICATION and wait for the server to enter COPY BOTH."""
        pg = self._conn.pgconn
        pg.send_query(command)
        self._flush_out()
        result = self._result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            self._raise_result(result)

    def _run(self) -> None:
        end: BaseException | None = None
        try:
            try:
                self._read()
            except _StoppedError:
                pass
            except psycopg.OperationalError as exc:  # the connection broke, or the stream ended
                self._raise_server_error()  # the server's own words, when it sent them
                raise self._ended(exc) from None
            self._finish()
        except BaseException as exc:  # handed to the consumer, raised there
            end = exc
        finally:  # closed before the hand-over: a busy consumer must not keep the walsender
            with contextlib.suppress(Exception):
                self._conn.close()
        self._frames.end(end, stopped=self._stop.is_set)

    def _read(self) -> None:
        pg = self._conn.pgconn
        get_copy_data = pg.get_copy_data
        batch_bytes = self.batch_bytes
        chunks: list[Any] = []
        size = 0
        first_at = 0.0  # when the batch's first frame came
        while not self._stop.is_set():
            self._report()
            self._frames.pass_pending()
            nbytes, data = get_copy_data(1)
            if nbytes > 0:
                self._heard_at = time.monotonic()
                if not chunks:
                    first_at = self._heard_at
                chunks.append(data)
                size += nbytes
                # Every frame libpq holds already, in a loop of its own: the per-frame cost is
                # what caps the stream (a frame is one message, often under 100 bytes).
                append = chunks.append
                while size < batch_bytes:
                    nbytes, data = get_copy_data(1)
                    if nbytes <= 0:
                        break
                    append(data)
                    size += nbytes
                if nbytes < 0:
                    continue  # handled on the next turn: get_copy_data says so again
                if size >= batch_bytes:
                    self._deliver(chunks)
                    chunks, size = [], 0
            elif nbytes == 0:
                due = first_at + GATHER_S
                if chunks and (size >= GATHER_BYTES or time.monotonic() >= due):
                    self._deliver(chunks)
                    chunks, size = [], 0
                    continue
                self._check_silence()
                self._wait(readable=True, until=due if chunks else None)
                pg.consume_input()
            else:  # the server ended the stream: an error, or its own shutdown
                if chunks:
                    self._deliver(chunks)
                self._raise_result(self._result())

    def _deliver(self, chunks: list[Any]) -> None:
        batch = frames(chunks)
        self._received = max(self._received, int(batch.wal_end))
        self._check_stopping(batch)
        if batch.keepalives:
            self._report(force=True)  # every ping answered, at once when a reply is asked
        if self._frames.offer(batch):
            self._heard_at = max(self._heard_at, time.monotonic())  # we were not listening

    def _reader_waits(self) -> None:
        """While the queue is full: answer on time, and stop when the consumer closed."""
        if self._stop.is_set():
            raise _StoppedError
        self._report()
        if self._alive is not None:
            self._alive()

    def _check_stopping(self, batch: FrameBatch) -> None:
        """End the stream when the server is shutting down.

        A walsender asks for a reply at once after half its ``wal_sender_timeout`` without
        one, at most once per reply. A walsender whose server is shutting down waits until
        the client has confirmed what it sent, and asks again after every reply, many times a
        second. The lake has not committed all of that, so we may not confirm it: the stream
        ends here instead (the server goes down, nothing is lost, the next run resumes from
        the confirmed position).
        """
        now = time.monotonic()
        self._asked = [at for at in self._asked if now - at < STOPPING_WITHIN_S]
        self._asked += [now for ping in batch.keepalives if ping.reply_requested]
        if len(self._asked) >= STOPPING_REQUESTS:
            raise SlotStreamError(self.slot, self._server, "the server is shutting down")

    def _check_silence(self) -> None:
        """Ask a quiet server to answer; past its limits, ``Silence.check`` ends the stream."""
        self._silence.check(self._heard_at)
        now = time.monotonic()
        if now - self._heard_at >= self._interval and now - self._sent_at >= self._interval / 2:
            self._report(force=True, reply=True)

    def _release(self) -> bool:
        """Once START_REPLICATION was accepted: whether our walsender no longer holds the slot,
        waited for and ended if need be (``walsender.release``)."""
        if not self._started:
            return True
        return release(self._side, self.slot, self.walsender_pid, label=self._label,
                       secrets=self._secrets)  # fmt: skip

    def _report(self, *, force: bool = False, reply: bool = False) -> None:
        """A status update when the confirmed position moved, when forced, or when one is due;
        ``reply`` asks the server to answer at once."""
        flushed = self._flushed
        now = time.monotonic()
        if not force and flushed == self._sent_flush and now - self._sent_at < self._interval:
            return
        received = max(self._received, flushed)
        update = status_update(received=received, flushed=flushed, reply=reply)
        self._conn.pgconn.put_copy_data(update)
        self._flush_out()
        self._sent_flush, self._sent_at = flushed, now

    def _finish(self) -> None:
        """Confirm a last time, end our side of the COPY and wait for the server's end."""
        pg = self._conn.pgconn
        if pg.status != pq.ConnStatus.OK:
            return
        self._report(force=True)
        pg.put_copy_end()
        self._flush_out()
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        while time.monotonic() < deadline:
            nbytes, _ = pg.get_copy_data(1)
            if nbytes > 0:
                continue  # what the server sent before it read our end: not wanted
            if nbytes == 0:
                self._wait(readable=True, until=deadline)
                pg.consume_input()
                continue
            while pg.is_busy() and time.monotonic() < deadline:
                self._wait(readable=True, until=deadline)
                pg.consume_input()
            if pg.is_busy():
                break
            failed = False
            while (result := pg.get_result()) is not None:
                failed = failed or result.status == pq.ExecStatus.FATAL_ERROR
            self._ended_cleanly = not failed
            return
        log.info("slot %s: the server did not end the stream within %.0f s of our end (a "
                 "walsender decoding reads nothing meanwhile); closing the connection",
                 self.slot, CLOSE_TIMEOUT_S)  # fmt: skip

    # -- libpq, nonblocking ---------------------------------------------------------------------

    def _wait(self, *, readable: bool, until: float | None = None) -> None:
        """Until the socket is ready (or a status update is due, or the consumer wakes us)."""
        timeout = max(0.0, self._interval - (time.monotonic() - self._sent_at))
        if until is not None:
            timeout = min(timeout, max(0.0, until - time.monotonic()))
        if readable and self._low_water:  # the socket wakes us only for GATHER_BYTES
            timeout = min(timeout, GATHER_S)
        poller = select.poll()  # poll, not select: any descriptor number
        poller.register(self._conn.pgconn.socket, select.POLLIN if readable else select.POLLOUT)
        poller.register(self._wake_r, select.POLLIN)
        ready = poller.poll(timeout * 1000)
        if any(fd == self._wake_r for fd, _ in ready):
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)

    def _flush_out(self) -> None:
        pg = self._conn.pgconn
        while pg.flush() == 1:
            if self._stop.is_set():
                raise _StoppedError
            self._wait(readable=False)

    def _result(self) -> pq.abc.PGresult | None:
        pg = self._conn.pgconn
        while pg.is_busy():
            if self._stop.is_set():
                raise _StoppedError
            self._wait(readable=True, until=time.monotonic() + 1.0)
            pg.consume_input()
        return pg.get_result()

    def _raise_result(self, result: pq.abc.PGresult | None) -> None:
        """Raise the server's error as the peek's statements raise it."""
        if result is not None and result.status in (
            pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK,
        ):  # fmt: skip
            raise SlotStreamError(self.slot, self._server, "the server ended it (a shutdown?)")
        encoding = self._conn.info.encoding
        error: Exception
        if result is None:
            message = self._conn.pgconn.error_message.decode(encoding, "replace").strip()
            error = psycopg.OperationalError(message or "the connection was lost")
        else:
            error = psycopg.errors.error_from_result(result, encoding=encoding)
        try:
            with slot_errors(self.slot, setting=lambda name: "unknown", server=self._server):
                raise error
        except PgLogReplError:
            raise
        except psycopg.Error as exc:
            raise self._ended(exc) from None

    def _raise_server_error(self) -> None:
        """Raise the error the server ended the stream with, if it sent one."""
        pg = self._conn.pgconn
        with contextlib.suppress(psycopg.Error):
            pg.consume_input()
        result = None
        with contextlib.suppress(psycopg.Error):
            result = None if pg.is_busy() else pg.get_result()
        if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
            self._raise_result(result)

    def _ended(self, exc: Exception) -> SlotStreamError:
        return SlotStreamError(self.slot, self._server, brief(exc, self._secrets))

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _close_pipe(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._wake_r = self._wake_w = -1


def _wake_for_bytes(fd: int, size: int) -> bool:
    """Have the socket report itself readable only once ``size`` bytes wait (SO_RCVLOWAT).

    A walsender sends every message on its own, often under 100 bytes: woken for each, the
    reader spends more time waking than reading (3.3 s of CPU against 0.5 s for 1.25 million
    messages, measured). ``_wait`` still looks every ``GATHER_S``, for the last few bytes.
    False where the system does not have it."""
    import socket

    try:
        with socket.socket(fileno=os.dup(fd)) as sock:  # the same socket; libpq keeps its own
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, size)
    except (OSError, AttributeError):
        return False
    return True
