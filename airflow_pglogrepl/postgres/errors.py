"""Translate psycopg errors (by SQLSTATE class) into the project's exceptions.

The server's messages are good but generic ("replication slot ... is active for PID 4242");
ours name the object and the fix, and are classes callers can catch. The original psycopg error
stays attached as ``__cause__`` for the full server detail.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import psycopg
from psycopg import errors as pgerr

from airflow_pglogrepl import conninfo
from airflow_pglogrepl.exceptions import (
    InvalidSlotNameError,
    PublicationNotFoundError,
    PublisherNotConfiguredError,
    ServerNotConfiguredError,
    SlotAdvanceError,
    SlotAlreadyExistsError,
    SlotInUseError,
    SlotNotFoundError,
    SubscriptionStatementError,
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


# -- subscription statements: the subscriber relays the publisher's refusals ---------------


def publisher_unreachable(exc: Exception) -> bool:
    text = str(exc)
    return isinstance(exc, pgerr.ConnectionFailure | pgerr.ConnectionException) or (
        "could not connect to publisher" in text
    )


@contextmanager
def subscription_statement_errors(
    secrets: Sequence[str], publisher_params: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Re-raise psycopg errors with every secret removed from the message; a publisher that
    refused for want of a setting raises ``PublisherNotConfiguredError`` (the redacted
    ``SubscriptionStatementError`` its cause)."""
    try:
        yield
    except psycopg.Error as exc:
        text = conninfo.redact(str(exc).strip(), secrets)
        error = SubscriptionStatementError(f"subscription statement failed: {text}")
        # the publisher restarting or out of senders, a lock or a lost session: these pass
        error.retryable = publisher_unreachable(exc) or isinstance(
            exc, psycopg.OperationalError | pgerr.LockNotAvailable
        )
        refused = publisher_refusal(text, publisher_params or {})
        if refused is not None:
            raise refused from error
        raise error from None


_SLOT_REFUSED = re.compile(r'could not create replication slot "([^"]*)"')
# PostgreSQL 17 quotes the setting's name
_SENDERS = re.compile(r'exceeds "?max_wal_senders"? \(currently (\d+)\)')
_QUOTED_SETTING = re.compile(r'"(wal_level|logical|max_wal_senders|max_replication_slots)"')
_NO_SLOTS = re.compile(r'max_replication_slots"? > 0')
# PostgreSQL 16+ decodes on a standby only when its primary has wal_level = logical
_ON_PRIMARY = re.compile(WAL_LEVEL_REFUSAL.pattern + r'"?\s+on the primary')

# The publisher's refusals told by a sentence of its own, the first that matches: the sentence,
# the setting it lacks and the value wanted, the fix ({where}: the publisher's host:port), and
# whether the same run can pass later.
_REFUSALS = (
    (_ON_PRIMARY, "wal_level", "logical",
     "the publisher {where} is a standby, which decodes only when its primary logs enough: set "
     "wal_level = logical on the primary of the publisher {where} (a standby) (ALTER SYSTEM SET "
     "wal_level = 'logical', or in its postgresql.conf) and restart the primary; until then "
     "every run fails alike", False),
    (WAL_LEVEL_REFUSAL, "wal_level", "logical",
     "set wal_level = logical on the publisher {where} (ALTER SYSTEM SET wal_level = "
     "'logical', or in its postgresql.conf) and restart it: wal_level only changes on restart, "
     "and until then every run fails alike", False),
    (_NO_SLOTS, "max_replication_slots", "above 0",
     "raise max_replication_slots on the publisher {where} (it is 0: no slot can be created) "
     "and restart it; until then every run fails alike", False),
    # often passing: table-sync slots hold places only while their tables copy
    (re.compile("all replication slots are in use"), "max_replication_slots",
     "larger than the number of slots in use",
     "drop abandoned slots on the publisher {where} (pg_replication_slots where active is "
     "false) or raise max_replication_slots there and restart it", True),
)  # fmt: skip


def publisher_refusal(
    text: str, publisher_params: Mapping[str, str]
) -> PublisherNotConfiguredError | None:
    """The setting the publisher lacks, when its error (relayed by the subscriber) says so in
    the server's own sentence: names (a slot's, a database's) are quoted out first, so that a
    slot named "all_replication_slots_..." is taken for nothing."""
    host = publisher_params.get("host", "localhost")
    where = f"{host}:{publisher_params.get('port', '5432')}"
    publisher = (
        f"PostgreSQL {conninfo.describe(publisher_params)}" if publisher_params else "server"
    )
    slot = _SLOT_REFUSED.search(text)
    refused = f"to create replication slot {slot.group(1)!r}" if slot else "the subscription"
    # 17 quotes the settings as it quotes names: unquote those, then empty every quoted name
    said = re.sub(r'"[^"]*"', '""', _QUOTED_SETTING.sub(r"\1", text))
    for sentence, setting, wanted, fix, retryable in _REFUSALS:
        if sentence.search(said):
            return PublisherNotConfiguredError(
                setting, wanted, publisher, refused,
                fix.format(where=where) + ". Nothing was created on the subscriber",
                retryable=retryable,
            )  # fmt: skip
    senders = _SENDERS.search(said)
    if senders:
        none = senders.group(1) == "0"
        return PublisherNotConfiguredError(
            "max_wal_senders", "above the replication connections in use", publisher,
            "a replication connection", (
                f"raise max_wal_senders on the publisher {where} (it is 0: no replication "
                f"connection is allowed) and restart it"
                if none
                else f"end unused replication connections on the publisher {where} "
                f"(pg_stat_replication) or raise max_wal_senders there and restart it"
            ) + ". Nothing was created on the subscriber",
            retryable=not none,
        )  # fmt: skip
    return None
