"""The lake's errors as an on-call engineer reads them at 3 a.m.: each says that nothing was
lost (nothing committed, the slot not moved, or nothing done), names the object and the fix,
and is retryable only when running again can help."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import lake as errors
from airflow_pglogrepl.exceptions.base import PgLogReplError
from airflow_pglogrepl.lsn import LSN

SLOT, LAKE, TABLE = "lake_shop", "s3://bucket/lakes/shop", 'public."Or ders"'
HOLDER = {"pid": 4242, "application_name": "pglogrepl drain lake_shop", "client_addr": None,
          "backend_start": "2026-11-26 03:00"}  # fmt: skip

# (the error, what it must name, whether running again can help)
CASES = [
    (errors.SlotAheadOfLakeError(SLOT, LSN(0x200), LSN(0x100), LAKE),
     [SLOT, "0/200", "0/100", "Nothing was drained"], False),
    (errors.LakeFromAnotherSourceError(SLOT, LAKE, {"system_identifier": 1, "timeline": 1},
                                       {"system_identifier": 2, "timeline": 1}),
     [LAKE, "system identifier 1", "system identifier 2", "accept_source_change"], False),
    (errors.IncompatibleSchemaChangeError(TABLE, "column a became text"),
     [TABLE, "column a became text", "slot did not move", "re-snapshot"], False),
    (errors.ColumnBackfillError(TABLE, "made_at"), [TABLE, "'made_at'", "volatile default"], False),
    (errors.UnstorableValueError(TABLE, "at", "294277-01-01", "after year 294247"),
     [TABLE, "'at'", "294277-01-01", "slot did not move"], False),
    (errors.QuarantinedTablesError(LAKE, {TABLE: {"error": "UnstorableValueError", "what": "x",
                                                  "since": "0/100"}}),
     [LAKE, TABLE, "_pglogrepl/quarantine", "re-snapshot"], False),
    (errors.LakeWriterBusyError(SLOT, HOLDER),
     [SLOT, "backend pid 4242", "local socket", "pg_terminate_backend(4242)", "Nothing was done"],
     True),
    (errors.LakeWriterBusyError(SLOT, None), [SLOT, "not visible to this role"], True),
    (errors.WriterLockLostError(SLOT, "its session ended"),
     [SLOT, "its session ended", "not moved past what the lake holds", "pooler"], True),
    (errors.UnsafeRetentionError(TABLE, 1, 168, "its readers"),
     [TABLE, "1 hours", "168 hours", "Nothing was done"], False),
    (errors.LakeCommitConflictError(TABLE, "pglogrepl-lake_shop", 0x100, 0x180, 0x200),
     [TABLE, "0/100", "0/180", "another writer", "max_active_runs=1"], True),
    (errors.LakeCommitConflictError(TABLE, "pglogrepl-lake_shop", 0x200, 0x200, 0x200),
     [TABLE, "already 0/200", "only go forward"], True),
    (errors.LakeOfAnotherSlotError(LAKE, {"slot": "other", "database": "shop"}, SLOT),
     [LAKE, "'other'", SLOT, "Nothing was written"], False),
    (errors.LakeSnapshotUnfinishedError(LAKE, SLOT, "0/100", ["0/100"]),
     [LAKE, SLOT, "staged at 0/100", "slot did not move", "--replace-slot"], False),
    (errors.TableNotInLakeError(TABLE, LAKE, ["public.a", "public.b"]),
     [TABLE, LAKE, "public.a, public.b"], False),
]  # fmt: skip


@pytest.mark.parametrize(("error", "names", "retryable"), CASES)
def test_each_error_says_nothing_was_lost_and_names_the_object_and_the_fix(
    error: PgLogReplError, names: list[str], retryable: bool
) -> None:
    text = str(error)
    assert "Fix:" in text or "report this" in text, text
    for name in names:
        assert name in text, (name, text)
    assert bool(getattr(error, "retryable", False)) is retryable


def test_the_lake_and_slot_disagreeing_is_a_lake_error() -> None:
    """``LakeMismatchError``: draining on would lose or double changes; callers catch that
    family."""
    for error in (errors.SlotAheadOfLakeError(SLOT, LSN(2), LSN(1), LAKE),
                  errors.LakeCommitConflictError(TABLE, "a", 1, 2, 3),
                  errors.LakeSnapshotUnfinishedError(LAKE, SLOT, None, [])):  # fmt: skip
        assert isinstance(error, errors.LakeMismatchError) and isinstance(error, errors.LakeError)
    assert isinstance(errors.IncompatibleSchemaChangeError(TABLE, "x"), errors.SchemaChangedError)
