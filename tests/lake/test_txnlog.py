"""A table's app transactions read newest-first from its commit files: the newest version at or
below a bound, versions without the app's transaction belonging to the one before them, and a log
cleaned up below a checkpoint answered from it, or refused past it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.exceptions import LakeError
from airflow_pglogrepl.lake.txnlog import HistoryExpiredError, TxnLog, TxnVersion

APP = "pglogrepl-lake_shop"


def write(uri: str, txn: int | None, app: str = APP) -> None:
    from deltalake import CommitProperties, Transaction, write_deltalake

    rows = pa.table({"id": [txn or 0]})
    properties = CommitProperties(app_transactions=[Transaction(app, txn)]) if txn else None
    write_deltalake(uri, rows, mode="append", commit_properties=properties)


@pytest.fixture
def table(tmp_path: Path) -> str:
    """Versions 0 to 4: transactions 0x100, 0x200, none (an upkeep), another app's, 0x500."""
    uri = str(tmp_path / "state")
    for txn, app in ((0x100, APP), (0x200, APP), (None, APP), (0x400, "other"), (0x500, APP)):
        write(uri, txn, app)
    return uri


def test_the_newest_version_at_or_below_a_bound(table: str) -> None:
    log = TxnLog(table, APP)
    assert log.exists and log.newest == 4
    assert log.latest() == TxnVersion(4, 0x500)
    # versions 2 and 3 carry no transaction of the app: they belong to 0x200
    assert log.at_or_below(0x4FF) == TxnVersion(3, 0x200)
    assert log.at_or_below(0x200) == TxnVersion(3, 0x200)
    assert log.at_or_below(0x1FF) == TxnVersion(0, 0x100)
    assert log.at_or_below(0xFF) is None  # the app had not written it yet
    assert TxnLog(table, "nobody").latest() is None


def test_a_log_read_once_sees_no_later_version(table: str) -> None:
    log = TxnLog(table, APP)
    write(table, 0x600)
    assert log.latest() == TxnVersion(4, 0x500) and TxnLog(table, APP).latest() == TxnVersion(
        5, 0x600
    )


def test_no_table_is_no_answer(tmp_path: Path) -> None:
    log = TxnLog(str(tmp_path / "absent"), APP)
    assert not log.exists and log.latest() is None


def test_a_cleaned_log_answers_from_its_checkpoint_or_refuses(table: str) -> None:
    from deltalake import DeltaTable

    DeltaTable(table, version=3).create_checkpoint()  # at version 3: transaction 0x200
    for version in range(3):
        (Path(table) / "_delta_log" / f"{version:020d}.json").unlink()
    log = TxnLog(table, APP)
    assert log.at_or_below(0x4FF) == TxnVersion(3, 0x200)  # from the checkpoint
    with pytest.raises(HistoryExpiredError, match="older commit files were cleaned up"):
        TxnLog(table, APP).at_or_below(0x1FF)
    (Path(table) / "_delta_log" / f"{3:020d}.checkpoint.parquet").unlink()
    (Path(table) / "_delta_log" / "_last_checkpoint").unlink(missing_ok=True)
    with pytest.raises(LakeError, match="no commit file for version 2 and no checkpoint"):
        TxnLog(table, APP)
