"""Translate psycopg errors (by SQLSTATE class) into the project's exceptions.

The server's messages are good but generic ("replication slot ... is active for PID 4242");
ours name the object and the fix, and are classes callers can catch. The original psycopg error
stays attached as ``__cause__`` for the full server detail.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from psycopg import errors as pgerr

from airflow_pglogrepl.exceptions import (
    InvalidSlotNameError,
    PublicationNotFoundError,
    ServerNotConfiguredError,
    SlotAdvanceError,
    SlotAlreadyExistsError,
    SlotInUseError,
    SlotNotFoundError,
)

_ACTIVE_PID = re.compile(r"active for PID (\d+)")
_MISSING_PUBLICATION = re.compile(r'publication "(.*)" does not exist')
# The server's sentence ("logical decoding requires wal_level >= logical"; 17 quotes the names),
# not the words anywhere in the text: an error naming a slot "orders_wal_level" is not about it
WAL_LEVEL_REFUSAL = re.compile(r'wal_level"?\s*>=\s*"?logical')
WAL_LEVEL_FIX = (
    "set wal_level = logical (ALTER SYSTEM SET wal_level = 'logical' or in postgresql.conf) "
    "and restart PostgreSQL; wal_level only changes on restart"
)


def wal_level_error(current: str, server: str | None = None) -> ServerNotConfiguredError:
    """The error for a server whose ``wal_level`` is below ``logical``; ``server``: its
    ``host:port``, named in the fix when known."""
    fix = WAL_LEVEL_FIX
    if server:
        fix = (
            f"set wal_level = logical on {server} (ALTER SYSTEM SET wal_level = 'logical' or in "
            f"its postgresql.conf) and restart it; wal_level only changes on restart"
        )
    return ServerNotConfiguredError("wal_level", current, "'logical'", fix, server=server)


@contextmanager
def slot_errors(
    slot: str, *, setting: Callable[[str], str], server: str | None = None
) -> Iterator[None]:
    """Map errors raised by statements on ``slot``.

    ``setting(name)`` reads a server setting; it is called only to enrich a configuration error
    with the current value, on a connection that is still usable (autocommit). ``server``
    (``host:port``) is named in a configuration error's fix.
    """
    try:
        yield
    except pgerr.UndefinedObject as exc:
        # 42704 is any missing object: a publication pgoutput was asked to read, too
        publication = _MISSING_PUBLICATION.search(exc.diag.message_primary or str(exc))
        if publication:
            raise PublicationNotFoundError([publication.group(1)], slot) from exc
        raise SlotNotFoundError(slot) from exc
    except pgerr.ObjectInUse as exc:
        match = _ACTIVE_PID.search(str(exc))
        raise SlotInUseError(slot, int(match.group(1)) if match else None) from exc
    except pgerr.DuplicateObject as exc:
        raise SlotAlreadyExistsError(slot) from exc
    except pgerr.InvalidName as exc:
        raise InvalidSlotNameError(slot) from exc
    except pgerr.ObjectNotInPrerequisiteState as exc:
        text = str(exc)
        if WAL_LEVEL_REFUSAL.search(text):
            raise wal_level_error(_safe(setting, "wal_level"), server) from exc
        if "max_replication_slots" in text:
            raise _slots_exhausted(_safe(setting, "max_replication_slots"), server) from exc
        raise _advance_error(slot, exc) from exc
    except pgerr.ConfigurationLimitExceeded as exc:
        # 53400 is any configured limit: slots, or the peek's temporary file
        if "temp_file_limit" in str(exc):
            raise ServerNotConfiguredError(
                "temp_file_limit",
                _safe(setting, "temp_file_limit"),
                "larger than the biggest transaction a window holds, or -1",
                f"a peek of slot {slot!r} holds its window, whole transactions, in a temporary "
                f"file, and one is bigger than that. Nothing was committed and the slot did not "
                f"move; every retry fails alike. ALTER ROLE <drain role> SET temp_file_limit = "
                f"-1 (a superuser may)",
            ) from exc
        raise _slots_exhausted(_safe(setting, "max_replication_slots"), server) from exc
    except pgerr.InvalidParameterValue as exc:
        raise _advance_error(slot, exc) from exc


def _advance_error(slot: str, exc: pgerr.Error) -> SlotAdvanceError:
    # pg_replication_slot_advance: "cannot advance replication slot to X, minimum is Y", or a
    # slot that has never reserved WAL.
    return SlotAdvanceError(
        slot,
        f"replication slot {slot!r}: {_first_line(str(exc))}. A slot only moves forward; "
        f"get_slot() shows its confirmed_flush_lsn",
    )


def _slots_exhausted(current: str, server: str | None = None) -> ServerNotConfiguredError:
    there = f" on {server}" if server else ""
    exhausted = ServerNotConfiguredError(
        "max_replication_slots",
        current,
        "larger than the number of slots in use",
        f"drop abandoned slots{there} (see pg_replication_slots where active is false) or raise "
        f"max_replication_slots and restart {'it' if server else 'PostgreSQL'}",
        server=server,
    )
    # often passing: a subscription's table-sync slots hold places only while tables copy
    exhausted.retryable = True
    return exhausted


def _safe(setting: Callable[[str], str], name: str) -> str:
    try:
        return setting(name)
    except pgerr.Error:
        return "unknown"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
