"""The lake's quarantine through the window API (no JVM, no server): its rows commit with the
window, a window drained again after a crash adds none twice whatever its bounds, and a table
is held until a re-snapshot covers its quarantined changes."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_pglogrepl.lake import delta
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.quarantine import Cause, held, quarantine_schema
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from tests.support.crash import commit_dying_before_the_point

pytestmark = pytest.mark.unit


def kept(*lsns: int, table: str = "public.t") -> pa.Table:
    """Quarantine rows of ``table``, one per commit LSN (as ``quarantine.rows`` makes them)."""
    return pa.Table.from_pylist(
        [{"table": table, "commit_lsn": lsn, "seq": 0, "xid": 1, "op": "I", "new": "{}",
          "old": None, "error": "UnstorableValueError", "message": "column 'at': too late",
          "window_start": "0/0", "window_end": "0/0",
          "quarantined_at": dt.datetime.now(dt.UTC)} for lsn in lsns],
        schema=quarantine_schema(),
    )  # fmt: skip


def test_a_crash_after_the_quarantine_commit_adds_nothing_twice(
    lake_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = lake_uri
    first = Lake(root, "s")
    window = Window(first, LSN(0x100))
    window.quarantine(kept(0x110, 0x150, 0x180))
    commit_dying_before_the_point(monkeypatch, window, LSN(0x200), changes=3)
    # the re-run drains the same changes again in smaller windows, then more
    rerun = Lake(root, "s")
    for start, end, lsns in ((0x100, 0x160, (0x110, 0x150)), (0x160, 0x300, (0x180, 0x250))):
        again = Window(rerun, LSN(start))
        again.quarantine(kept(*lsns))
        again.commit(LSN(end), transactions=len(lsns), changes=len(lsns))
    rows = delta.read_table(rerun.paths.quarantine()).column("commit_lsn").to_pylist()
    assert sorted(rows) == [0x110, 0x150, 0x180, 0x250]
    assert rerun.position() == LSN(0x300)


def test_a_table_is_held_until_a_release_and_never_merged_meanwhile(tmp_path: Path) -> None:
    """A merge never takes a held table's state past its quarantine (the state would claim the
    quarantined changes and the table would no longer look held: they were lost); a re-snapshot
    ends the hold with a release row at its point."""
    from airflow_pglogrepl.lake.quarantine import release
    from airflow_pglogrepl.merge.materialize import materialize, pending_tables
    from airflow_pglogrepl.tables import TableRef

    t = TableRef("public", "t")
    lake = Lake(str(tmp_path / "lake"), "s")
    window = Window(lake, LSN(0x100))
    window.write(t, pa.table({"id": pa.array([1], pa.int64()), "_op": pa.array(["I"]),
                              "_commit_lsn": pa.array([0x110], pa.int64()),
                              "_seq": pa.array([0], pa.int64())}))  # fmt: skip
    window.commit(LSN(0x200), transactions=1, changes=1)
    later = Window(lake, LSN(0x200))  # the same run: t's next change cannot be stored
    later.quarantine(kept(0x210))
    later.commit(LSN(0x300), transactions=1, changes=1)
    cause = Cause("UnstorableValueError", "column 'at': too late", "0/0")
    assert held(lake) == {t: cause}

    def no_spark() -> None:
        raise AssertionError("Spark was asked for")

    assert pending_tables(lake) == [] and materialize(no_spark, lake) == {}
    assert materialize(no_spark, lake, tables=["public.t"]) == {}
    assert lake.state_version(t) is None and held(Lake(lake.root, "s")) == {t: cause}
    assert release(lake, t, LSN(0x500)) and not release(lake, t, LSN(0x600))
    assert held(Lake(lake.root, "s")) == {}
    # held again by a later change: a release covers only what is below its point
    again = Window(lake, LSN(0x300))
    again.quarantine(kept(0x650))
    again.commit(LSN(0x700), transactions=1, changes=1)
    assert set(held(Lake(lake.root, "s"))) == {t}
    # a table is named as PostgreSQL needs it to be named again (a snapshot's tables=)
    odd = TableRef("Sales", "my.Table")
    again = Window(lake, LSN(0x700))
    again.quarantine(kept(0x750, table=str(odd)))
    again.commit(LSN(0x800), transactions=1, changes=1)
    assert set(held(Lake(lake.root, "s"))) == {t, odd} and str(odd) == '"Sales"."my.Table"'
    # the upkeep keeps the quarantine's one file per window in check
    from airflow_pglogrepl.lake.retention import Keep
    from airflow_pglogrepl.lake.upkeep import QUARANTINE, Thresholds, upkeep

    report = upkeep(lake.root, "s", keep=Keep(hours=None, min_retention_hours=0.0),
                    thresholds=Thresholds())  # fmt: skip
    assert {t.table: t for t in report.tables}[QUARANTINE].compacted
    assert set(held(Lake(lake.root, "s"))) == {t, odd}


def test_a_cut_holding_a_quarantined_table_is_taken_before_its_quarantine(tmp_path: Path) -> None:
    """The table's changelog and state stop where its quarantine begins, and would look current
    at any later position: a cut that holds it is taken before, one without it is not."""
    from airflow_pglogrepl.lake.cut import consistent_cut
    from airflow_pglogrepl.tables import TableRef

    def batch(lsn: int) -> pa.Table:
        return pa.table({"id": pa.array([lsn], pa.int64()), "_op": pa.array(["I"]),
                         "_commit_lsn": pa.array([lsn], pa.int64()),
                         "_seq": pa.array([0], pa.int64())})  # fmt: skip

    lake = Lake(str(tmp_path / "lake"), "s")
    window = Window(lake, LSN(0x100))
    window.write(TableRef("public", "t"), batch(0x110))
    window.write(TableRef("public", "u"), batch(0x120))
    window.commit(LSN(0x200), transactions=2, changes=2)
    later = Window(lake, LSN(0x200))
    quarantined = kept(0x210)
    quarantined = quarantined.set_column(9, "window_start", pa.array(["0/200"]))
    later.quarantine(quarantined)
    later.write(TableRef("public", "u"), batch(0x220))
    later.commit(LSN(0x300), transactions=2, changes=2)
    cut = consistent_cut(lake.root, kind="changes", slot="s")
    assert cut.position == LSN(0x200)
    assert consistent_cut(lake.root, ["public.u"], kind="changes", slot="s").position == LSN(0x300)
    from airflow_pglogrepl.exceptions import ReplayRangeError
    from airflow_pglogrepl.lake.replay import changes_between

    assert changes_between(lake.root, "public.t", LSN(0x100), LSN(0x200)).num_rows == 1
    with pytest.raises(ReplayRangeError, match=r"from 0/200 on are in the lake's quarantine"):
        changes_between(lake.root, "public.t", LSN(0x100), LSN(0x300))
