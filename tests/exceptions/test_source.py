"""The source's errors as an on-call engineer reads them: each names the object, says what is
wrong and the fix, and says whether a retry can help."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import source as errors
from airflow_pglogrepl.exceptions.base import PgLogReplError

SLOT = 'lake "x"; y'


@pytest.mark.parametrize(
    ("error", "names"),
    [
        (errors.InvalidSlotNameError(SLOT), [SLOT, "lower-case letters"]),
        (errors.SlotNotFoundError(SLOT, "shop"), [SLOT, "'shop'", "pg_create_logical"]),
        (errors.SlotAlreadyExistsError(SLOT), [SLOT, "retains WAL"]),
        (errors.SlotInUseError(SLOT, 4242), [SLOT, "backend PID 4242", "pg_stat_replication"]),
        (errors.WrongPluginError(SLOT, "wal2json", "pgoutput"), ["'wal2json'", "'pgoutput'"]),
        (errors.SlotLostError(SLOT, "wal_removed"), [SLOT, "max_slot_wal_keep_size"]),
        (errors.ServerNotConfiguredError("wal_level", "replica", "logical", "set it",
                                         server="db1:5432"),
         ["db1:5432", "wal_level is 'replica'", "logical"]),
        (errors.PublisherNotConfiguredError("max_wal_senders", "above 0", "PostgreSQL db2", "a "
         "replication connection", "raise it"), ["db2", "max_wal_senders must be above 0"]),
    ],
)  # fmt: skip
def test_each_error_names_the_object_and_the_fix(error: PgLogReplError, names: list[str]) -> None:
    text = str(error)
    assert "Fix:" in text
    for name in names:
        assert name in text, (name, text)


def test_only_what_may_pass_is_retryable() -> None:
    assert errors.SlotInUseError(SLOT).retryable  # the other consumer may end
    assert errors.ConnectionFailedError("refused").retryable
    assert errors.PublisherNotConfiguredError("s", "r", "p", "x", "f", retryable=True).retryable
    for final in (errors.SlotNotFoundError(SLOT), errors.SlotLostError(SLOT),
                  errors.WrongPluginError(SLOT, "x", "pgoutput"), errors.InvalidSlotNameError(SLOT),
                  errors.PublisherNotConfiguredError("s", "r", "p", "x", "f")):  # fmt: skip
        assert not getattr(final, "retryable", False), final


@pytest.mark.parametrize("reason", [*errors.INVALIDATION_CAUSES, "something_new", None])
def test_a_lost_slot_says_why_in_the_servers_terms_and_how_to_prevent_it(
    reason: str | None,
) -> None:
    text = errors.lost_slot_message(SLOT, reason, "nothing can be drained from it")
    assert SLOT in text and "nothing can be drained from it" in text
    assert "never be used again" in text and "to keep it from happening again" in text
    if reason in errors.INVALIDATION_CAUSES:
        cause, prevent = errors.INVALIDATION_CAUSES[reason]
        assert f"({reason})" in text and cause in text and prevent in text
    elif reason:
        assert f"({reason})" in text and "server log" in text
    else:
        assert "wal_status = lost" in text


def test_decoding_errors_say_where_they_stopped() -> None:
    error = errors.UnknownRelationError("I", 1, 16384)
    assert isinstance(error, errors.DecodeError)
    assert (error.message_type, error.offset, error.relation_id) == ("I", 1, 16384)
    assert "offset 1" in str(error) and "confirmed_flush_lsn" in str(error)
    invalid = errors.InvalidLSNError("16/ZZ", "not hexadecimal")
    assert isinstance(invalid, ValueError) and "'16/B374D848'" in str(invalid)
