"""A stream's walsender: its connection (``open_walsender``) and PID, asked of the server
(``backend_pid``: a proxy such as PgBouncer reports its own), what it promises (its timings),
whether it still holds its slot, how long its silence is borne, and ending it when it outlives
its stream.

A walsender decoding a transaction that sends nothing (rows a publication's row filter rejects,
a big transaction on unpublished tables) sends nothing meanwhile, and reads our messages, so
answers a request to reply, only at every hundredth change once half its
``wal_sender_timeout`` has passed since it last did (at every hundredth change when the timeout
is 0, which may be seconds apart too). So a stream is asked about only past
``wal_sender_timeout`` and a margin (``silence_limit``), and then by a short ordinary session
of its own: the slot's ``active_pid`` is our walsender's PID for as long as it holds the slot
(``look``). Gone, or the server out of reach (a frozen host, a partition): the stream ends in
seconds instead of TCP's minutes. Still there: it is waited for, but not for ever
(``stuck_after``): a walsender that holds the slot and sends nothing past what a healthy one may
is stuck (SIGSTOP, a hung disk) or its host starved. A side session connects within
``SIDE_TIMEOUT_S`` or not at all, to the very server the stream reached (``side_params``), and
what it cannot learn is said (``look``) or logged (``release``), never raised. And a walsender
the server would take for a synchronous standby is refused (``refuse_synchronous_standby``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import (
    ConnectionFailedError,
    PgLogReplError,
    SlotStreamError,
    SlotStreamUnavailableError,
)
from airflow_pglogrepl.postgres.connect import (
    TEXT_OUTPUT,
    Conn,
    connect,
    long_work_settings,
    server_of,
    set_session,
)
from airflow_pglogrepl.postgres.locks import KEEPALIVES
from airflow_pglogrepl.postgres.slots import slot_holder, slot_holder_wait, terminate_holder

__all__ = [
    "RELEASE_WAIT_S", "SIDE_TIMEOUT_S", "STATUS_INTERVAL_S", "TERMINATE_WAIT_S", "Look",
    "Silence", "backend_pid", "brief", "keepalive_promised", "look", "open_walsender",
    "refuse_synchronous_standby",
    "release", "sender_timeout_s", "side_params", "silence_limit", "status_interval",
    "stuck_after", "synchronous_standby_match",
]  # fmt: skip

log = logging.getLogger("airflow_pglogrepl.stream")

# Seconds between status updates when nothing else makes us send one; shorter when the server's
# wal_sender_timeout is (a third of it), so two may be lost before it gives up on us.
STATUS_INTERVAL_S = 10.0
# A server we asked to answer that has sent nothing for this many status intervals, and for
# wal_sender_timeout and SILENCE_MARGIN_S when it has one, is asked about (``Silence``).
SILENT_INTERVALS = 3
SILENCE_MARGIN_S = 5.0
# How long a walsender that still holds the slot may send nothing (``stuck_after``).
#
# wal_sender_timeout > 0, PostgreSQL 15 and later: a walsender decoding a transaction that sends
# nothing still sends a keepalive asking for our reply once half its timeout has passed since
# our last reply, looking every hundred changes (WalSndUpdateProgress, from pgoutput's
# update_replication_progress, later the reorder buffer's update_progress_txn). Its silence
# outlasts the timeout only by the time a hundred changes take to decode, so STUCK_LIMITS
# silence limits (each the timeout and a margin: a hundred changes may take over three
# timeouts) is past anything a healthy walsender does; the default 60 s timeout ends a stuck
# stream after 260 s. Before 15 not every release keeps that promise, and with the timeout 0
# there is none: the walsender looks at its socket every hundred changes, however long they
# take. There STUCK_CAP_S: half an hour of a decode that sends nothing is no filter's cost.
STUCK_LIMITS = 4
STUCK_CAP_S = 1800.0
PROMISE_SINCE = 150000  # server_version_num from which the keepalive is counted on
# Seconds a side session may take to connect, and its statements to be acknowledged
# (tcp_user_timeout): the silence check runs in the stream's reader thread, which sends no
# status update meanwhile.
SIDE_TIMEOUT_S = 5
# After a stream ended: seconds its walsender is given to let go of the slot before it is
# terminated (``release``), then seconds for the terminated process to end.
RELEASE_WAIT_S = 2.0
TERMINATE_WAIT_S = 10.0


def status_interval(sender_timeout_s: float) -> float:
    """Seconds between status updates: ``STATUS_INTERVAL_S``, or a third of the server's
    ``wal_sender_timeout`` when that is shorter (0 means the server never times out)."""
    if sender_timeout_s <= 0:
        return STATUS_INTERVAL_S
    return min(STATUS_INTERVAL_S, sender_timeout_s / 3)


def silence_limit(interval: float, sender_timeout_s: float) -> float:
    """Seconds of silence before the stream asks whether its walsender is still there: three
    status intervals, and not before ``wal_sender_timeout`` and a margin (a walsender decoding
    reads our request to answer every half timeout). With none (0) it may be silent as long as
    the decoding takes: the check after every limit tells."""
    limit = SILENT_INTERVALS * interval
    if sender_timeout_s > 0:
        limit = max(limit, sender_timeout_s + SILENCE_MARGIN_S)
    return limit


def keepalive_promised(sender_timeout_s: float, server_version: int) -> bool:
    """Whether a walsender decoding sends a keepalive every half timeout (see STUCK_LIMITS)."""
    return sender_timeout_s > 0 and server_version >= PROMISE_SINCE


def stuck_after(limit: float, sender_timeout_s: float, server_version: int) -> float:
    """Seconds of silence after which a walsender that still holds the slot is taken for stuck:
    ``STUCK_LIMITS`` limits where the server promises a keepalive every half timeout, else
    ``STUCK_CAP_S`` (see both)."""
    if keepalive_promised(sender_timeout_s, server_version):
        return STUCK_LIMITS * limit
    return max(STUCK_CAP_S, STUCK_LIMITS * limit)


def open_walsender(params: dict[str, str], slot: str, *, label: str) -> Conn:
    """A replication connection, whose backend is the walsender, with the session the decoder
    expects (``TEXT_OUTPUT``); ``SlotStreamUnavailableError`` when the server refuses it."""
    try:  # TCP keepalives, as the writer lock's session: a dead peer is noticed in a minute
        conn = connect({**KEEPALIVES, **params}, label=label, replication=True)
    except ConnectionFailedError as exc:
        raise SlotStreamUnavailableError(slot, str(exc)) from None
    try:
        set_session(conn, TEXT_OUTPUT)  # pgoutput prints values with this session's settings
        set_session(conn, long_work_settings(conn.info.server_version))
        conn.pgconn.nonblocking = 1
    except BaseException:
        conn.close()
        raise
    return conn


def sender_timeout_s(conn: Conn) -> float:
    """The server's ``wal_sender_timeout`` for this connection, in seconds (0: none)."""
    row = conn.execute(
        "SELECT setting::float8 AS ms FROM pg_settings WHERE name = %s", ("wal_sender_timeout",)
    ).fetchone()
    return max(0.0, float(row["ms"]) / 1000) if row else 0.0


def backend_pid(conn: Conn) -> int:
    """The PID of the server process behind ``conn`` (on a replication connection: the
    walsender that will hold the slot), asked of the server: a proxy in between (PgBouncer)
    reports its own in ``conn.info.backend_pid``."""
    row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
    assert row is not None
    return int(row["pid"])


def side_params(params: dict[str, str], conn: Conn) -> dict[str, str]:
    """``params`` pinned to the server ``conn`` reached: its host, address and port, so a side
    session asks the walsender's own server, not another one of a list of hosts
    (``load_balance_hosts``, a name with several addresses, ``target_session_attrs``)."""
    info = conn.info
    pinned = {**params, "host": info.host, "port": str(info.port), "target_session_attrs": "any"}
    pinned.pop("hostaddr", None)
    pinned.pop("load_balance_hosts", None)  # one host and one address: nothing to balance
    with contextlib.suppress(psycopg.NotSupportedError):  # libpq before 12
        if info.hostaddr:  # empty through a Unix socket: host is its directory
            pinned["hostaddr"] = info.hostaddr
    return pinned


def brief(exc: BaseException, secrets: Sequence[str]) -> str:
    """An error's first line, with its SQLSTATE when it has one, redacted: libpq's text goes on
    over lines ("This probably means the server terminated abnormally ...") that say nothing
    more, and a reason travels in one line (``SlotStreamError.reason``, a log line)."""
    text = conninfo.redact(str(exc), secrets)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0].rstrip(".") if lines else type(exc).__name__
    sqlstate = getattr(exc, "sqlstate", None)
    return f"{first} (SQLSTATE {sqlstate})" if sqlstate else first


@dataclass(frozen=True)
class Look:
    """What a side session saw: ``gone`` says why our walsender is taken for gone (None: it
    still holds the slot); ``wait`` is what it waits on (``wait_event_type/wait_event``)."""

    gone: str | None
    wait: str = "unknown"


def look(
    params: dict[str, str], slot: str, pid: int, *, label: str, secrets: Sequence[str]
) -> Look:
    """Whether the walsender ``pid`` still holds ``slot``, and what it waits on. A server that
    cannot be reached counts as gone: the stream cannot be waited on either."""
    try:
        with side_session(params, label) as conn:
            holder, wait = slot_holder_wait(conn, slot)
    except (PgLogReplError, psycopg.Error) as exc:
        reason = brief(exc, secrets)
        return Look(f"a new session could not ask whether its walsender is alive ({reason})")
    if holder != pid:
        return Look(f"its walsender (pid {pid}) no longer holds the slot")
    return Look(None, wait or "none: running")


class Silence:
    """How long the stream may hear nothing from the server (``check``, in the reader thread).

    ``side``: the parameters of the side sessions (``side_params``); ``server``: ``host:port``
    for messages; ``sender_timeout_s``, ``server_version``: the walsender's."""

    def __init__(
        self, side: dict[str, str], slot: str, pid: int, *, server: str, label: str,
        secrets: Sequence[str], sender_timeout_s: float, server_version: int,
    ) -> None:  # fmt: skip
        self._side, self._label, self._secrets = side, label, secrets
        self.slot, self.pid, self.server = slot, pid, server
        self.sender_timeout_s = sender_timeout_s
        self._promised = keepalive_promised(sender_timeout_s, server_version)
        self.interval = status_interval(sender_timeout_s)
        self.limit = silence_limit(self.interval, sender_timeout_s)
        self.stuck_after = stuck_after(self.limit, sender_timeout_s, server_version)
        self._checked_at = 0.0  # when the last check found our walsender holding the slot
        self._checks = 0  # checks of the silence going on

    @classmethod
    def of(
        cls, conn: Conn, side: dict[str, str], slot: str, pid: int, *, label: str,
        secrets: Sequence[str],
    ) -> Silence:  # fmt: skip
        """The silence of the stream on replication connection ``conn``."""
        return cls(side, slot, pid, server=server_of(conn), label=label, secrets=secrets,
                   sender_timeout_s=sender_timeout_s(conn),
                   server_version=conn.info.server_version)  # fmt: skip

    def check(self, heard_at: float) -> None:
        """The server was last heard from at ``heard_at`` (``time.monotonic``). Past every
        limit of silence, ask whether our walsender holds the slot: gone, unreachable, or
        silent past ``stuck_after`` raises ``SlotStreamError``; else it is waited for, said at
        INFO the first time and at WARNING from the second."""
        now = time.monotonic()
        if now - max(heard_at, self._checked_at) < self.limit:
            return
        if self._checked_at < heard_at:
            self._checks = 0  # heard from since the last check: a silence of its own
        silent = now - heard_at
        seen = look(self._side, self.slot, self.pid, label=self._label, secrets=self._secrets)
        if seen.gone is not None:
            why = f"the server sent nothing for {silent:.0f} s, though asked to answer, and "
            raise SlotStreamError(self.slot, self.server, why + seen.gone)
        if silent >= self.stuck_after:
            raise SlotStreamError(self.slot, self.server, self._stuck(silent, seen.wait))
        self._checked_at = time.monotonic()
        self._checks += 1
        log.log(logging.INFO if self._checks == 1 else logging.WARNING,
                "slot %s: its walsender (pid %d) holds the slot but has sent nothing for %.0f s "
                "(wait event: %s); it may be decoding a transaction that sends nothing (rows a "
                "row filter rejects, changes to unpublished tables): waiting for it, until "
                "%.0f s of silence", self.slot, self.pid, silent, seen.wait,
                self.stuck_after)  # fmt: skip

    def _stuck(self, silent: float, wait: str) -> str:
        if self._promised:
            owed = (f"a walsender sends a keepalive every half wal_sender_timeout "
                    f"({self.sender_timeout_s:g} s) even while it decodes")  # fmt: skip
        else:
            owed = f"no decode that sends nothing lasts {silent:.0f} s"
        return (f"its walsender (pid {self.pid}) still holds the slot but has sent nothing for "
                f"{silent:.0f} s, though asked to answer (wait event: {wait}); {owed}, so it "
                f"is stuck or its host starved. Look at pid {self.pid} on the server: "
                f"pg_stat_activity's wait_event, the process's CPU and I/O, the server's log; "
                f"pg_terminate_backend({self.pid}) ends it")  # fmt: skip


def release(
    params: dict[str, str], slot: str, pid: int, *, label: str, secrets: Sequence[str]
) -> bool:
    """Make sure the walsender ``pid`` no longer holds ``slot``: wait for it to let go,
    bounded, then terminate it and wait again. True: the slot is free of it (free, or held by
    another process); False: it still holds it, or whether it does could not be learned.

    A stream ended on our side (an error, a silence) leaves a walsender that goes on decoding
    until it next looks at its socket, seconds to minutes later, holding the slot meanwhile:
    the next reader (a retry, the drain's peek) would meet ``SlotInUseError``. Never raises
    (it runs as a stream ends, often with an error of its own in flight): what it cannot do
    is logged."""
    try:
        with side_session(params, label) as conn:
            if _let_go(conn, slot, pid, RELEASE_WAIT_S):
                return True
            log.warning("slot %s: its walsender (pid %d) still holds it %.0f s after the stream "
                        "ended (it reads nothing while it decodes): terminating it, so the next "
                        "reader finds the slot free", slot, pid, RELEASE_WAIT_S)  # fmt: skip
            terminate_holder(conn, slot, pid)
            if _let_go(conn, slot, pid, TERMINATE_WAIT_S):
                return True
            log.warning("slot %s: its walsender (pid %d) still holds it %.0f s after "
                        "pg_terminate_backend; the next reader may find it in use until that "
                        "process ends", slot, pid, TERMINATE_WAIT_S)  # fmt: skip
    except (PgLogReplError, psycopg.Error) as exc:
        log.warning("slot %s: could not make sure its walsender (pid %d) let go of it (%s); the "
                    "next reader may find it in use until that process ends", slot, pid,
                    brief(exc, secrets))  # fmt: skip
    return False


def side_session(params: dict[str, str], label: str) -> Conn:
    """A short ordinary session beside the stream, connected within ``SIDE_TIMEOUT_S`` or not
    at all, its statements acknowledged within as long."""
    return connect(
        {**params, "connect_timeout": str(SIDE_TIMEOUT_S),
         "tcp_user_timeout": str(SIDE_TIMEOUT_S * 1000)},
        label=label,
    )  # fmt: skip


def _let_go(conn: Conn, slot: str, pid: int, timeout_s: float) -> bool:
    """Whether ``pid`` stops holding ``slot`` within ``timeout_s``, polled (quickly at first:
    a walsender that ends with its stream lets go within milliseconds)."""
    deadline = time.monotonic() + timeout_s
    pause = 0.01
    while slot_holder(conn, slot) == pid:
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.25)
    return True


def refuse_synchronous_standby(conn: Conn, slot: str) -> None:
    """Refuse to stream where the server would take this walsender for a synchronous standby.

    The stream confirms only what the lake committed, and a run nothing past its end: every
    commit on the source would wait for the drain. ``synchronous_standby_names`` naming
    ``*`` or this connection's ``application_name`` is refused (``reader="auto"`` peeks).
    """
    row = conn.execute(
        "SELECT current_setting('synchronous_standby_names') AS names, "
        "current_setting('application_name') AS name"
    ).fetchone()
    if row and synchronous_standby_match(str(row["names"]), str(row["name"])):
        raise SlotStreamUnavailableError(
            slot, f"synchronous_standby_names ({row['names']!r}) would make its walsender "
            f"({row['name']!r}) a synchronous standby, and every commit on the source wait for "
            f"the lake. Fix: name the standbys in synchronous_standby_names instead of '*', or "
            f"give the drain's connection another application_name",
        )  # fmt: skip


def synchronous_standby_match(setting: str, application_name: str) -> bool:
    """Whether ``synchronous_standby_names`` (``FIRST 1 (a, "b")``, ``ANY 2 (*)``, ``a, b``)
    names ``application_name`` or ``*`` (names compare case-insensitively, as the server's)."""
    body = setting.strip()
    match = re.match(r"(?is)^(?:(?:first|any)\s+)?\d+\s*\((.*)\)\s*$", body)
    if match:
        body = match.group(1)
    names = [part.strip() for part in body.split(",") if part.strip()]
    for name in names:
        if name.startswith('"') and name.endswith('"') and len(name) >= 2:
            name = name[1:-1].replace('""', '"')
        elif name == "*":
            return True
        if name.lower() == application_name.lower():
            return True
    return False
