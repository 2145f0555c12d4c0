"""A stream's walsender seen from outside the stream: whether it still holds its slot, and
ending it when it outlives its stream.

A walsender decoding a transaction that sends nothing reads its socket only now and then
(``hooks.pg.slot_stream`` says when), so neither a silent stream nor a closed one tells
whether it is still there. A short ordinary session of its own does: the slot's
``active_pid`` is the walsender's PID for as long as it holds the slot. The session connects
within ``SIDE_TIMEOUT_S`` or not at all, so a frozen host or a partition costs seconds, not
TCP's minutes; what it cannot learn is said (``gone``) or logged (``release``), never raised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import psycopg

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import PgLogReplError
from airflow_pglogrepl.hooks.pg.connect import Conn, connect
from airflow_pglogrepl.hooks.pg.slots import slot_holder, terminate_holder

__all__ = ["RELEASE_WAIT_S", "SIDE_TIMEOUT_S", "TERMINATE_WAIT_S", "gone", "release"]

log = logging.getLogger("airflow_pglogrepl.stream")

# Seconds such a session may take to connect, and its statements to be acknowledged
# (tcp_user_timeout): the silence check runs in the stream's reader thread, which sends no
# status update meanwhile.
SIDE_TIMEOUT_S = 5
# After a stream ended: seconds its walsender is given to let go of the slot before it is
# terminated (``release``), then seconds for the terminated process to end.
RELEASE_WAIT_S = 2.0
TERMINATE_WAIT_S = 10.0


def gone(
    params: dict[str, str], slot: str, pid: int, *, label: str, secrets: Sequence[str]
) -> str | None:
    """Why the walsender ``pid`` is taken for gone from ``slot``; None: it still holds it.
    A server that cannot be reached counts as gone: the stream cannot be waited on either."""
    try:
        with side_session(params, label) as conn:
            holder = slot_holder(conn, slot)
    except (PgLogReplError, psycopg.Error) as exc:
        reason = conninfo.redact(str(exc).strip().rstrip("."), secrets)
        return f"a new session could not ask whether its walsender is alive ({reason})"
    if holder != pid:
        return f"its walsender (pid {pid}) no longer holds the slot"
    return None


def release(
    params: dict[str, str], slot: str, pid: int, *, label: str, secrets: Sequence[str]
) -> None:
    """Make sure the walsender ``pid`` no longer holds ``slot``: wait for it to let go,
    bounded, then terminate it and wait again.

    A stream ended on our side (an error, a silence) leaves a walsender that goes on decoding
    until it next looks at its socket, seconds to minutes later, holding the slot meanwhile:
    the next reader (a retry, the drain's peek) would meet ``SlotInUseError``. Never raises
    (it runs as a stream ends, often with an error of its own in flight): what it cannot do
    is logged."""
    try:
        with side_session(params, label) as conn:
            if _let_go(conn, slot, pid, RELEASE_WAIT_S):
                return
            log.warning("slot %s: its walsender (pid %d) still holds it %.0f s after the stream "
                        "ended (it reads nothing while it decodes): terminating it, so the next "
                        "reader finds the slot free", slot, pid, RELEASE_WAIT_S)  # fmt: skip
            terminate_holder(conn, slot, pid)
            if _let_go(conn, slot, pid, TERMINATE_WAIT_S):
                return
            log.warning("slot %s: its walsender (pid %d) still holds it %.0f s after "
                        "pg_terminate_backend; the next reader may find it in use until that "
                        "process ends", slot, pid, TERMINATE_WAIT_S)  # fmt: skip
    except (PgLogReplError, psycopg.Error) as exc:
        reason = conninfo.redact(str(exc).strip().rstrip("."), secrets)
        log.warning("slot %s: could not make sure its walsender (pid %d) let go of it (%s); the "
                    "next reader may find it in use until that process ends", slot, pid,
                    reason)  # fmt: skip


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
