"""The drain loop without a server: a fake source (the ``DrainSource`` protocol) replays encoded
pgoutput rows, the lake is a real Delta lake on local disk, and the slot moves only after a
window's commit. Also: the Spark applications' code paths import no Airflow.

Then against a live cluster and real Spark: correctness, exactly once under crashes.
"""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest

from airflow_pglogrepl.exceptions import (
    LakeFromAnotherSourceError,
    LakeOfAnotherSlotError,
    LakeWriterBusyError,
    PublicationNotFoundError,
    SlotAheadOfLakeError,
    SlotInUseError,
    SlotLostError,
    WriterLockLostError,
)
from airflow_pglogrepl.lake.delta import open_table, read_table
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge.materialize import materialize
from airflow_pglogrepl.models.verdicts import drain_refusal
from airflow_pglogrepl.pipeline.drain import Drain
from airflow_pglogrepl.tables import TableRef
from airflow_pglogrepl.testing.wait import wait_until
from tests.support.drain import (
    TYPED_TABLE,
    all_changelog_keys,
    assert_state_equals_source,
    changelog,
    drain_app,
    drain_in_process,
    drain_only,
    insert_sql,
    lake_rows,
    lock_holders,
    random_row,
    source_rows,
    start_drain_app,
    summary,
)
from tests.support.fake_source import FakeSource
from tests.support.pgoutput_encoder import Session, relation
from tests.support.sources import Source
from tests.support.wal import PAGE_HEADER, WAL_PAGE, commit_after_page_header

INT8, TEXT = 20, 25


def two_transactions() -> Session:
    session = Session(start=0x1000)
    items = relation(16384, "items", [("id", INT8, True), ("name", TEXT)])
    session.add(items).begin(700, 0x1100).insert(16384, b"1", b"one").insert(16384, b"2", b"two")
    session.commit(0x1100, 0x1108)
    session.begin(701, 0x1200).insert(16384, b"3", b"three").commit(0x1200, 0x1208)
    return session


def test_a_drain_writes_the_lake_then_advances_the_slot(tmp_path: Path) -> None:
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x2000)
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=1 << 20)
    result = drain.run(time.monotonic()).to_dict()
    assert result["changes"] == 3 and result["transactions"] == 2
    assert source.advances == [LSN(0x2000)] and lake.position() == LSN(0x2000)
    rows = read_table(lake.paths.changes(TableRef("public", "items"))).to_pylist()
    assert sorted((r["id"], r["name"], r["_op"]) for r in rows) == [
        (1, "one", "I"), (2, "two", "I"), (3, "three", "I")
    ]  # fmt: skip


@pytest.mark.parametrize("arrow_fails", [False, True])
def test_both_decoding_paths_write_the_same_lake(tmp_path: Path, arrow_fails: bool) -> None:
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.arrow_fails = arrow_fails
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=1 << 20)
    result = drain.run(time.monotonic()).to_dict()
    assert result["columnar_windows"] == (0 if arrow_fails else 1)
    assert result["changes"] == 3 and result["transactions"] == 2
    rows = read_table(lake.paths.changes(TableRef("public", "items"))).to_pylist()
    assert sorted((r["id"], r["name"], r["_op"], r["_seq"]) for r in rows) == [
        (1, "one", "I", 0), (2, "two", "I", 1), (3, "three", "I", 0)
    ]  # fmt: skip


class CountingSource(FakeSource):
    peeks = 0

    def peek_arrow(
        self, slot: str, *, upto_lsn: LSN | str, options: Mapping[str, str]
    ) -> Iterator[Any]:
        self.peeks += 1
        yield from super().peek_arrow(slot, upto_lsn=upto_lsn, options=options)


def test_one_peek_serves_several_windows_cut_where_separate_peeks_would_end(
    tmp_path: Path,
) -> None:
    """Windows of 0x400 bytes from 0x1000, one peek for up to four: commits at 0x1100 and
    0x1200 (window 1), none in 0x1400-0x1800 (no empty window committed: it grows), 0x1900
    (window 2, ending at 0x1C00), 0x1D00 and 0x1E00 (the last, ending at the peek's end)."""
    session = Session(start=0x1000)
    items = relation(16384, "items", [("id", INT8, True), ("name", TEXT)])
    session.add(items)
    for xid, (commit, key) in enumerate([(0x1100, 1), (0x1200, 2), (0x1900, 3), (0x1D00, 4),
                                         (0x1E00, 5)]):  # fmt: skip
        session.lsn = commit - 0x40
        session.begin(700 + xid, commit).insert(16384, str(key).encode(), b"v")
        session.commit(commit, commit + 8)
    source = CountingSource(session.rows, confirmed=0x1000, flush=0x1F00)
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x400)
    result = drain.run(time.monotonic())
    assert source.peeks == 1
    assert [(int(w.start), int(w.end), w.transactions, w.changes) for w in result.windows] == [
        (0x1000, 0x1400, 2, 2), (0x1400, 0x1C00, 1, 1), (0x1C00, 0x1F00, 2, 2)
    ]  # fmt: skip
    assert source.advances == [LSN(0x1400), LSN(0x1C00), LSN(0x1F00)]
    rows = read_table(lake.paths.changes(TableRef("public", "items"))).to_pylist()
    by_key = {r["id"]: r["_commit_lsn"] for r in rows}
    assert by_key == {1: 0x1100, 2: 0x1200, 3: 0x1900, 4: 0x1D00, 5: 0x1E00}
    assert [w["end_lsn"] for w in lake.windows()] == ["0/1400", "0/1C00", "0/1F00"]


def test_a_run_reads_each_tables_log_once_in_each_thread_however_many_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an object store a table's first open is a listing and about fifteen GETs; a later one
    in the same run brings the opened table up to date (``lake.opened_tables``)."""
    import threading
    from collections import Counter

    from airflow_pglogrepl.lake import delta

    session = Session(start=0x1000)
    for xid, commit in enumerate(range(0x1100, 0x1F00, 0x300)):
        session.lsn = commit - 0x80  # (each window a peek of its own: relations sent again)
        session.add(relation(16384, "items", [("id", INT8, True), ("name", TEXT)]))
        session.add(relation(16385, "other", [("id", INT8, True), ("name", TEXT)]))
        session.begin(700 + xid, commit).insert(16384, str(xid).encode(), b"v")
        session.insert(16385, str(xid).encode(), b"w").commit(commit, commit + 8)
    loads: Counter[tuple[str, str]] = Counter()
    load = delta._load

    def counting(uri: str, version: int | None = None) -> Any:
        table = load(uri, version)
        if version is None and table is not None:  # (no table there: a listing, not kept)
            loads[uri.rsplit("/lake/", 1)[1], threading.current_thread().name[:14]] += 1
        return table

    monkeypatch.setattr(delta, "_load", counting)
    source = FakeSource(session.rows, confirmed=0x1000, flush=0x1F00)
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x300)
    assert len(drain.run(time.monotonic()).windows) >= 3
    assert loads and max(loads.values()) == 1, loads


def test_a_window_is_cut_after_every_table_of_a_batch_and_a_later_decline_loses_nothing(
    tmp_path: Path,
) -> None:
    """T1 (commit 0x1300) writes tables a and b; T2 (0x1600, past the first window's end 0x1400)
    writes a; all in one batch, whose pieces are a = [T1, T2] and b = [T1]. The first window
    must hold T1's rows of both tables before it commits. A logical message in the next batch
    makes the columnar path decline: the per-message path goes on from 0x1400, where T1 is
    already skipped, so a row of T1 left out of the first window would be lost."""
    # The Relations come first in the stream with LSNs past 0x1400, so that a peek from 0x1000
    # sees one description per table and the fake's peek from 0x1400 sees them too.
    session = Session(start=0x1401)
    table_a = relation(16384, "a", [("id", INT8, True), ("name", TEXT)])
    table_b = relation(16385, "b", [("id", INT8, True), ("name", TEXT)])
    session.add(table_a, table_b)
    session.lsn = 0x1000
    session.begin(700, 0x1300).insert(16384, b"1", b"t1").insert(16385, b"1", b"t1")
    session.commit(0x1300, 0x1308)
    session.lsn = 0x1500
    session.begin(701, 0x1600).insert(16384, b"2", b"t2").commit(0x1600, 0x1608)
    first_batch = len(session.rows)
    session.begin(702, 0x1780)
    session.raw(b"M\x01" + (0x1700).to_bytes(8, "big") + b"p\x00" + (1).to_bytes(4, "big") + b"x")
    session.insert(16384, b"3", b"t3").commit(0x1780, 0x1788)
    source = FakeSource(session.rows, confirmed=0x1000, flush=0x1800)
    source.batch_messages = first_batch
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x400)
    result = drain.run(time.monotonic())
    assert [(int(w.start), int(w.end), w.decoder, w.transactions) for w in result.windows] == [
        (0x1000, 0x1400, "columnar", 1), (0x1400, 0x1800, "reference", 2)
    ]  # fmt: skip
    for name, keys in (("a", [1, 2, 3]), ("b", [1])):
        rows = read_table(lake.paths.changes(TableRef("public", name))).to_pylist()
        assert sorted(r["id"] for r in rows) == keys, name


def test_what_a_killed_stream_kept_in_progress_is_removed_by_a_run_that_peeks(
    tmp_path: Path,
) -> None:
    """A run killed while it kept rows of a transaction in progress leaves them; the next
    run removes them whichever reader it uses (here the peek, as a role without REPLICATION)."""
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x2000)
    lake = Lake(str(tmp_path / "lake"), "s")
    left = tmp_path / "lake" / "_pglogrepl" / "in_progress" / "700"
    left.mkdir(parents=True)
    (left / "0000000001.arrow").write_bytes(b"kept by a run that was killed")
    result = Drain(source=source, lake=lake, slot="s", publications=["p"],
                   max_window_bytes=1 << 20).run(time.monotonic()).to_dict()  # fmt: skip
    assert result["reader"] == "peek" and result["changes"] == 3
    assert not left.parent.exists()


class DroppingSource(FakeSource):
    """PostgreSQL 18: the publication is dropped after the first advance, and a peek only
    warns, so every later window would come back empty."""

    def advance_slot(self, name: str, upto: LSN | str) -> LSN:
        end = super().advance_slot(name, upto)
        self.dropped_publications.add("p")
        self.rows = []
        return end


@pytest.mark.parametrize("arrow_fails", [False, True])
def test_a_dropped_publication_stops_the_drain_before_a_commit(
    tmp_path: Path, arrow_fails: bool
) -> None:
    source = FakeSource(two_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.dropped_publications.add("p")
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x180)
    with pytest.raises(PublicationNotFoundError, match=r"publication 'p' does not exist"):
        drain.run(time.monotonic())
    assert source.advances == [] and lake.position() is None

    source = DroppingSource(two_transactions().rows, confirmed=0x1000, flush=0x2000)
    source.arrow_fails = arrow_fails
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x180)
    with pytest.raises(PublicationNotFoundError, match=r"slot did not move"):
        drain.run(time.monotonic())
    # The fake filters by row LSN: its per-message peek up to 0x1180 also holds the second
    # transaction (commit 0x1200), so that window ends just past it.
    first_end = LSN(0x1201 if arrow_fails else 0x1180)
    assert source.advances == [first_end] and lake.position() == first_end


def test_a_writer_that_lost_its_lock_commits_and_advances_nothing(tmp_path: Path) -> None:
    """The lock's proof runs before every commit and every advance: once it fails, the run
    stops where it is."""
    proofs: list[str] = []

    def proof() -> None:
        proofs.append("checked")
        if len(proofs) > 3:  # the claim's, the coverage record's, the first table's pass
            raise WriterLockLostError("s", "its session failed: terminated")

    lake = Lake(str(tmp_path / "lake"), "s", writer_check=proof)
    session = two_transactions()
    items = relation(16385, "other", [("id", INT8, True)])
    session.add(items).begin(702, 0x1280).insert(16385, b"9").commit(0x1280, 0x1288)
    source = FakeSource(session.rows, confirmed=0x1000, flush=0x1300)
    with pytest.raises(WriterLockLostError, match=r"nothing more was committed"):
        Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x1000,
              columnar=False).run(time.monotonic())  # fmt: skip
    assert source.advances == [] and lake.position() is None
    assert len(lake.changes_tables()) == 1  # one table committed, the second refused


def test_a_drain_run_again_holds_only_what_is_in_quarantine_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding: a Drain run twice kept a table released between its runs in the
    quarantine (the held tables were added to, never replaced)."""
    from airflow_pglogrepl.lake.quarantine import Cause
    from airflow_pglogrepl.pipeline import drain as drain_module

    items = TableRef("public", "items")
    answers = iter([{items: Cause("X", "a test", "0/1000")}, {}])
    monkeypatch.setattr(drain_module, "held", lambda lake: next(answers))
    session = Session(start=0x1000)
    described = relation(16384, "items", [("id", INT8, True), ("name", TEXT)])
    session.add(described).begin(700, 0x1100).insert(16384, b"1", b"one").commit(0x1100, 0x1108)
    session.lsn = 0x1300  # the second run's transaction, past the first run's end
    session.add(described).begin(701, 0x1400).insert(16384, b"2", b"two").commit(0x1400, 0x1408)
    source = FakeSource(session.rows, confirmed=0x1000, flush=0x1200)
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=1 << 20)
    first = drain.run(time.monotonic())
    assert list(first.quarantined) == ["public.items"]
    source.flush = LSN(0x1500)
    second = drain.run(time.monotonic())
    assert second.quarantined == {} and second.windows[-1].tables == {"public.items": 1}


def test_drain_refusal_names_lost_before_in_use() -> None:
    slot = FakeSource([], confirmed=0x10, flush=0x10).slot
    assert drain_refusal(slot) is None
    lost = drain_refusal(dataclasses.replace(slot, wal_status="lost", active=True))
    assert isinstance(lost, SlotLostError) and "drop it" in str(lost)
    busy = drain_refusal(dataclasses.replace(slot, active=True, active_pid=42))
    assert isinstance(busy, SlotInUseError) and "42" in str(busy)


def test_the_spark_applications_import_no_airflow() -> None:
    code = (
        "import sys\n"
        "import airflow_pglogrepl.spark.drain_app, airflow_pglogrepl.spark.snapshot_app\n"
        "import airflow_pglogrepl.pipeline.drain, airflow_pglogrepl.spark.snapshot\n"
        "import airflow_pglogrepl.postgres.source, airflow_pglogrepl.merge.materialize\n"
        "bad = [m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')]\n"
        "assert not bad, bad[:5]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# Drains run in this process's Spark session or as an application of their own (a JVM).


def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["_commit_lsn"], r["_seq"]))


TABLES = [TableRef("public", n) for n in ("typed_a", "typed_b", "plain_c", "full_d", "log_e")]


def workload(src: Source, seed: int) -> int:
    """Random DML on published tables (and noise elsewhere); returns the row changes made."""
    rng = random.Random(seed)
    for name in ("typed_a", "typed_b"):
        src.sql(TYPED_TABLE.format(name=name))
    src.sql("CREATE TABLE plain_c (id int PRIMARY KEY, v text)")
    src.sql("CREATE TABLE full_d (a int, b text)")  # no key at all
    src.sql("ALTER TABLE full_d REPLICA IDENTITY FULL")
    src.sql("CREATE TABLE log_e (n int, msg text)")  # no key, no identity: inserts only
    src.sql("CREATE TABLE noise (x int)")
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE typed_a, typed_b, plain_c, full_d, "
            "log_e")  # fmt: skip
    changes = 0
    with src.cluster.connect(src.db) as conn:

        def run(statement: str, params: Any = None) -> None:
            nonlocal changes
            changes += conn.execute(statement, params).rowcount

        keys = {"typed_a": list(range(1, 121)), "typed_b": list(range(1, 61))}
        with conn.transaction():
            for table, ids in keys.items():
                for key in ids:
                    run(insert_sql(table), random_row(rng, key, big=key % 10 == 0))
        run("INSERT INTO plain_c SELECT g, 'c' || g FROM generate_series(1, 200) g")
        run("INSERT INTO full_d VALUES (1, 'dup'), (1, 'dup'), (2, 'x'), (3, NULL)")
        run("INSERT INTO log_e VALUES (1, 'dup'), (1, 'dup'), (2, NULL)")
        run("INSERT INTO noise SELECT generate_series(1, 500)")
        changes -= 500  # noise is not published
        for step in range(40):
            table = rng.choice(["typed_a", "typed_b"])
            if step % 9 == 0:
                run("INSERT INTO log_e VALUES (%s, 'step'), (%s, 'step')", (10 + step, 10 + step))
            with conn.transaction():
                kind = rng.random()
                if kind < 0.35:  # update non-TOAST columns: big stays unchanged (u in pgoutput)
                    run(f"UPDATE {table} SET i = %s, t = NULL WHERE id %% 7 = %s",
                        (rng.randrange(1000), step % 7))  # fmt: skip
                elif kind < 0.5:  # key-changing update
                    run(f"UPDATE {table} SET id = id + 100000 WHERE id = %s",
                        (rng.choice(keys[table]),))  # fmt: skip
                elif kind < 0.65:
                    run(f"DELETE FROM {table} WHERE id = %s", (rng.choice(keys[table]),))
                elif kind < 0.85:
                    key = 1000 + step
                    run(insert_sql(table), random_row(rng, key, big=step % 3 == 0))
                else:
                    run(f"UPDATE {table} SET n = n + 1, big = big WHERE id %% 11 = %s",
                        (step % 11,))  # fmt: skip
        run("UPDATE full_d SET b = 'one' WHERE ctid = (SELECT min(ctid) FROM full_d WHERE a = 1)")
        run("DELETE FROM full_d WHERE a = 3")
        with conn.transaction():
            run("DELETE FROM plain_c WHERE id > 150")
            conn.execute("TRUNCATE plain_c")
            changes += 1  # one T row for plain_c
            run(
                "INSERT INTO plain_c SELECT g, 'after truncate ' || g FROM generate_series(1, 30) g"
            )
        run("UPDATE plain_c SET id = -id WHERE id <= 5")
    return changes


def two_tables_written_together(src: Source, transactions: int = 6) -> list[TableRef]:
    """Tables t and u, published, and transactions that each write both (several windows)."""
    src.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    src.sql("CREATE TABLE u (id int PRIMARY KEY, n int)")
    src.sql(f"CREATE PUBLICATION {src.publication} FOR TABLE t, u")
    for step in range(transactions):
        src.sql(
            "WITH a AS (INSERT INTO t SELECT g, repeat('x', 200)"
            " FROM generate_series(%s::int, %s) g)"
            " INSERT INTO u SELECT g, g FROM generate_series(%s::int, %s) g",
            (step * 50, step * 50 + 49, step * 50, step * 50 + 49),
        )
    return [TableRef("public", "t"), TableRef("public", "u")]


def end_the_lock(src: Source, how: str) -> None:
    if how == "terminate":
        src.sql("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS p(pid)",
                (lock_holders(src),))  # fmt: skip
    else:
        src.cluster.restart()  # pg_ctl restart -m fast


@pytest.mark.spark
@pytest.mark.parametrize("how", ["terminate", "restart"])
def test_a_run_that_loses_its_lock_stops_before_its_next_commit(
    spark: Any, source: Source, tmp_path: Path, how: str
) -> None:
    """Before: every call but the lock's opened a session of its own, so a run whose lock
    session was ended (pg_terminate_backend, a publisher restart, a dropped connection) went on
    committing and advancing beside whoever took the lock next."""
    tables = two_tables_written_together(source)
    lake_root = str(tmp_path / "lake")
    before = source.hook().get_slot(source.slot).confirmed_flush_lsn
    paused = tmp_path / "pause"
    paused.mkdir()
    run = start_drain_app(source, lake_root, "--no-materialize", "--max-window-bytes", "8192",
                          pause=paused)  # fmt: skip
    try:
        wait_until(lambda: any(paused.glob("before_commit.*")), what="the first window's commit")
        end_the_lock(source, how)
        (paused / "go").touch()
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, err[-3000:]
    assert "WriterLockLostError" in err and "nothing more was committed" in err
    lake = Lake(lake_root, source.slot)
    assert lake.position() is None and lake.changes_tables() == []
    assert source.hook().get_slot(source.slot).confirmed_flush_lsn == before
    drain_in_process(spark, source, lake_root, window=8192)
    for ref in tables:
        assert_state_equals_source(source, lake_root, ref)  # equal, no (_commit_lsn, _seq) twice


@pytest.mark.spark
@pytest.mark.parametrize("still_sending", [False, True])
def test_a_walsender_terminated_mid_window_loses_and_repeats_nothing(
    spark: Any, source: Source, tmp_path: Path, still_sending: bool
) -> None:
    """The stream's server end is killed while a window is read but not committed. When the
    server had more to send, or had not yet said it sent everything, the run fails (retryable)
    and the next one resumes from what the lake holds; when it had, the run ends well and
    advances the slot itself, since its last confirm went nowhere. Either way every change is
    in the lake once."""
    tables = two_tables_written_together(source)
    if still_sending:  # more than the reader's queue and the sockets hold: 40 MB of rows
        for step in range(40):
            source.sql("INSERT INTO t SELECT g, repeat('y', 200) FROM generate_series(%s::int, "
                       "%s) g", (1000 + step * 4000, 1000 + step * 4000 + 3999))  # fmt: skip
    lake_root = str(tmp_path / "lake")
    paused = tmp_path / "pause"
    paused.mkdir()
    run = start_drain_app(source, lake_root, "--no-materialize", "--max-window-bytes", "8192",
                          "--reader", "stream", pause=paused)  # fmt: skip
    try:
        wait_until(lambda: any(paused.glob("before_commit.*")), what="the first window's commit")
        killed = source.sql(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = %s AND active_pid IS NOT NULL", (source.slot,),
        )  # fmt: skip
        assert killed == [(True,)], "the stream's walsender was not found"
        (paused / "go").touch()
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    if still_sending or run.returncode == 1:  # the server's position past the end not seen
        assert run.returncode == 1 and "SlotStreamError" in err, err[-3000:]
    else:  # its last confirm went nowhere: the slot is advanced the peek's way
        position = Lake(lake_root, source.slot).position()
        assert source.hook().get_slot(source.slot).confirmed_flush_lsn == position
    # (the rerun reads with either reader: "auto" streams when the killed run's small windows
    # left restart_lsn far behind, as they do with 40 MB still to send)
    drain_in_process(spark, source, lake_root, window=1 << 20)
    for ref in tables:
        assert_state_equals_source(source, lake_root, ref)  # equal, no (_commit_lsn, _seq) twice


@pytest.mark.spark
def test_a_second_drain_is_refused_while_the_roles_idle_timeout_passes(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """The issue's reproduction: idle_session_timeout = 1s for the drain's role, a drain held
    between windows, a second drain started meanwhile. Before: the second was granted the lock
    and both committed the same window (each change twice in changes/)."""
    tables = two_tables_written_together(source)
    role = f"drainer_{source.slot}"[:63]
    source.sql(f"CREATE ROLE \"{role}\" LOGIN SUPERUSER PASSWORD 'pw'")
    source.sql(f"ALTER ROLE \"{role}\" SET idle_session_timeout = '1s'")
    from airflow_pglogrepl.conninfo import make_dsn

    dsn = make_dsn({**source.cluster.params(source.db), "user": role, "password": "pw"})
    lake_root = str(tmp_path / "lake")
    paused = tmp_path / "pause"
    paused.mkdir()
    first = start_drain_app(source, lake_root, "--no-materialize", "--max-window-bytes", "8192",
                            pause=paused, dsn=dsn)  # fmt: skip
    try:
        wait_until(lambda: any(paused.glob("before_commit.*")), what="the first window's commit")
        probe = psycopg.connect(dsn, autocommit=True)  # idle for less time than the lock's
        probe_pid = probe.info.backend_pid
        wait_until(
            lambda: not source.sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (probe_pid,)),
            what="the role's idle_session_timeout ending an idle session",
        )
        probe.close()
        second = start_drain_app(source, lake_root, "--no-materialize", dsn=dsn)
        _, second_err = second.communicate(timeout=300)
        (paused / "go").touch()
        _, err = first.communicate(timeout=300)
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
        source.sql(f'ALTER ROLE "{role}" RESET idle_session_timeout')
    assert second.returncode == 1 and LakeWriterBusyError.__name__ in second_err, second_err
    assert first.returncode == 0, err[-3000:]
    drain_in_process(spark, source, lake_root, window=8192)
    for ref in tables:
        assert_state_equals_source(source, lake_root, ref)


def test_a_lake_is_refused_to_another_slot_and_to_another_server(
    source: Source, subscriber: Any, tmp_path: Path
) -> None:
    """A lake records its source at its first commit; a drain of another slot of the same
    database, or of a slot of the same name on another server, writes nothing into it."""
    two_tables_written_together(source, transactions=2)
    lake_root = str(tmp_path / "lake")
    hook = source.hook()

    def drain(src: Source) -> Any:
        lake = Lake(lake_root, src.slot)
        with src.hook().writer_lock(src.slot) as lock:
            lake.writer_check = lock.check
            return Drain(source=src.hook(), lake=lake, slot=src.slot,
                         publications=[src.publication], max_window_bytes=1 << 20,
                         ).run(time.monotonic())  # fmt: skip

    drain(source)
    lake = Lake(lake_root, source.slot)
    rows, position = read_table(lake.paths.windows()).num_rows, lake.position()
    versions = {t: Lake(lake_root, source.slot).changes_version(t) for t in lake.changes_tables()}

    second = Source(source.cluster, source.db, f"{source.slot}_b", source.publication)
    second.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (second.slot,))
    elsewhere = Source(subscriber, f"{source.db}_elsewhere", source.slot, source.publication)
    subscriber.create_database(elsewhere.db)
    elsewhere.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    elsewhere.sql(f"CREATE PUBLICATION {elsewhere.publication} FOR TABLE t")
    elsewhere.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (source.slot,))
    try:
        source.sql("INSERT INTO t VALUES (-1, 'after')")
        elsewhere.sql("INSERT INTO t VALUES (-1, 'elsewhere')")
        slots = {o.slot + o.db: o.hook().get_slot(o.slot).confirmed_flush_lsn
                 for o in (second, elsewhere)}  # fmt: skip
        with pytest.raises(LakeOfAnotherSlotError, match=rf"belongs to slot '{source.slot}'"):
            drain(second)
        with pytest.raises(LakeFromAnotherSourceError, match=r"system identifier"):
            drain(elsewhere)
        assert read_table(lake.paths.windows()).num_rows == rows
        assert lake.position() == position
        assert {t: Lake(lake_root, source.slot).changes_version(t) for t in versions} == versions
        assert slots == {o.slot + o.db: o.hook().get_slot(o.slot).confirmed_flush_lsn
                         for o in (second, elsewhere)}  # fmt: skip
        assert hook.get_slot(source.slot).confirmed_flush_lsn == position
    finally:
        second.sql("SELECT pg_drop_replication_slot(%s)", (second.slot,))
        elsewhere.sql("SELECT pg_drop_replication_slot(%s)", (source.slot,))


@pytest.mark.spark
def test_random_dml_in_many_windows_lands_exactly(
    spark: Any, source: Source, tmp_path: Path, lake_uri: str
) -> None:
    # a second slot, drained by the reference path (psycopg, per-message decoder) alone
    reference = Source(source.cluster, source.db, f"{source.slot}_ref", source.publication)
    source.sql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (reference.slot,))
    expected_changes = workload(source, seed=20261122)
    lake_root = lake_uri
    result = drain_in_process(spark, source, lake_root, window=12 * 1024)
    assert result["windows"] > 10, result
    assert result["changes"] == expected_changes
    assert result["columnar_windows"] > result["windows"] // 2, result
    # state/ equals every source table, row for row
    for ref in TABLES:
        assert lake_rows(lake_root, ref) == source_rows(source.cluster, source.db, ref.name), ref
    # the changelog holds every change once: (_commit_lsn, _seq) unique, counts add up
    keys = all_changelog_keys(lake_root, TABLES)
    assert len(keys) == expected_changes == len(set(keys))
    assert open_table(f"{lake_root}/changes/public.noise") is None
    # TOAST: an unchanged big value is flagged, not written as NULL
    rows = changelog(lake_root, TableRef("public", "typed_a"))
    assert any(r["_op"] == "U" and r["_unchanged"] == ["big"] for r in rows)
    # the slot sits exactly at the lake's last commit
    slot = source.hook().get_slot(source.slot)
    assert slot.confirmed_flush_lsn == LSN(result["confirmed_flush_lsn_after"])
    # a second run with nothing new drains zero changes and succeeds
    again = drain_in_process(spark, source, lake_root, window=64 * 1024)
    assert again["changes"] == 0
    # the reference path writes the same changelog, row for row (into a local lake: on the
    # bucket's run it would repeat the local run's comparison)
    ref_lake = str(tmp_path / "reference")
    try:
        if "://" in lake_root:
            return
        done = drain_in_process(spark, reference, ref_lake, window=12 * 1024, columnar=False,
                                small_rows=0)  # and every state merged by Spark # fmt: skip
        assert done["columnar_windows"] == 0 and done["changes"] == expected_changes
        for ref in TABLES:
            assert ordered(changelog(ref_lake, ref)) == ordered(changelog(lake_root, ref)), ref
            assert lake_rows(ref_lake, ref) == lake_rows(lake_root, ref), ref
    finally:
        source.sql("SELECT pg_drop_replication_slot(%s)", (reference.slot,))


HOSTILE_TABLE = '"Sch; ema"."Tab ""le"" é"'


def drain_hostile_names(spark: Any, source: Source, lake_root: str) -> Source:
    """A publication, schema, table and column named with quotes, a semicolon, a backslash and
    unicode, two changes drained (a first state: no JVM); the publication's source."""
    hostile = Source(source.cluster, source.db, source.slot, 'pub "q"; \\ é')
    table = HOSTILE_TABLE
    source.sql('CREATE SCHEMA "Sch; ema"')
    source.sql(f'CREATE TABLE {table} (id int PRIMARY KEY, "co""l\\é" text)')
    source.sql(f'CREATE PUBLICATION "pub ""q""; \\ é" FOR TABLE {table}')
    source.sql(f"INSERT INTO {table} VALUES (1, 'a'), (2, 'b;''c')")
    source.sql(f'UPDATE {table} SET "co""l\\é" = \'d\' WHERE id = 1')
    result = drain_in_process(spark, hostile, lake_root, window=1 << 30)
    assert result["columnar_windows"] == result["windows"] == 1, result
    assert lake_rows(lake_root, TableRef("Sch; ema", 'Tab "le" é')) == [(1, "d"), (2, "b;'c")]
    return hostile


@pytest.mark.pgversion
def test_hostile_names_are_bound_and_escaped_on_every_major(source: Source, tmp_path: Path) -> None:
    """What a server's version could change: the peek's arguments (the publication's name) and
    the decoded relation names. Merged without a JVM, so the version matrix starts no Spark."""

    def no_spark() -> Any:
        raise AssertionError("a first state of keyed rows needs no Spark")

    drain_hostile_names(no_spark, source, str(tmp_path / "lake"))


@pytest.mark.spark
def test_hostile_names_go_through_the_columnar_path(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    """Quotes, a semicolon, a backslash and unicode in the publication, schema, table and
    column names: the peek's arguments are bound, the lake's directories escaped. A column
    name Delta Lake stores only under column mapping turns it on (tests/spark/test_column_names.py
    covers every such name)."""
    lake_root = str(tmp_path / "lake")
    hostile = drain_hostile_names(spark, source, lake_root)
    table = HOSTILE_TABLE
    ref = TableRef("Sch; ema", 'Tab "le" é')

    source.sql(f'ALTER TABLE {table} ADD COLUMN "first name" text')
    source.sql(f"INSERT INTO {table} VALUES (3, 'e', 'f')")
    drain_in_process(spark, hostile, lake_root, window=1 << 30)
    assert lake_rows(lake_root, ref) == [(1, "d", None), (2, "b;'c", None), (3, "e", "f")]


@pytest.mark.spark
@pytest.mark.parametrize("reader", ["stream", "peek"])
def test_idle_publication_still_advances_the_slot(
    spark: Any, source: Source, tmp_path: Path, reader: str
) -> None:
    """An empty window commits too; the peek cuts one per window's bytes, the stream only at
    the run's end (a window is cut by the commits it holds)."""
    source.sql("CREATE TABLE published (id int PRIMARY KEY)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE published")
    source.sql("CREATE TABLE busy (x text)")
    before = source.hook().get_slot(source.slot).confirmed_flush_lsn
    source.sql("INSERT INTO busy SELECT repeat('w', 200) FROM generate_series(1, 5000)")
    result = drain_in_process(spark, source, str(tmp_path / "lake"), window=256 * 1024,
                              reader=reader)  # fmt: skip
    assert result["reader"] == reader
    assert result["changes"] == 0 and result["windows"] >= (2 if reader == "peek" else 1)
    after = source.hook().get_slot(source.slot).confirmed_flush_lsn
    assert before is not None and after is not None and after - before > 1_000_000


@pytest.mark.spark
def test_slot_ahead_of_lake_fails_loudly(spark: Any, source: Source, tmp_path: Path) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    source.sql("INSERT INTO t VALUES (1)")
    lake_root = str(tmp_path / "lake")
    drain_in_process(spark, source, lake_root, window=1 << 20)
    source.sql("INSERT INTO t VALUES (2)")
    hook = source.hook()
    hook.advance_slot(source.slot, hook.flush_lsn())  # someone else consumed the change
    with pytest.raises(SlotAheadOfLakeError) as info:
        drain_in_process(spark, source, lake_root, window=1 << 20)
    text = str(info.value)
    slot_lsn = hook.get_slot(source.slot).confirmed_flush_lsn
    assert str(slot_lsn) in text and "ahead of the lake" in text


@pytest.mark.spark
@pytest.mark.parametrize("fault", ["mid_write:2", "after_write", "after_commit"])
def test_crash_then_rerun_is_exactly_once(
    spark: Any, source: Source, lake_uri: str, fault: str
) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    for chunk in range(3):
        source.sql(
            "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(%s::int, %s::int) g",
            (chunk * 1000 + 1, chunk * 1000 + 1000),
        )
    source.sql("UPDATE t SET v = 'changed' WHERE id % 10 = 0")
    lake_root = lake_uri
    # The application dies abruptly (its own process, no clean-up) at the fault point; the
    # re-run recovers the lake and the slot. Both runs skip the merge (no JVM in the process:
    # a local lake needs none to drain); the shared session materializes afterwards.
    args = ("--max-window-bytes", "100000", "--batch-rows", "400", "--no-materialize")
    crashed = drain_app(source, lake_root, *args, fault=fault)
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    lake = Lake(lake_root, source.slot)
    if fault == "after_commit":  # the window is committed but the slot never moved
        position = lake.position()
        assert position is not None
        assert source.hook().get_slot(source.slot).confirmed_flush_lsn < position
    done = summary(drain_app(source, lake_root, *args))
    assert done["spark_start_s"] is None  # the drain itself never started Spark
    materialize(spark, lake)
    ref = TableRef("public", "t")
    keys = all_changelog_keys(lake_root, [ref])
    assert len(keys) == len(set(keys)) == 3300
    assert lake_rows(lake_root, ref) == source_rows(source.cluster, source.db, "t")
    assert done["lag_bytes_left"] < 100_000
    assert lake.position() == source.hook().get_slot(source.slot).confirmed_flush_lsn


@pytest.mark.spark
@pytest.mark.pgversion
def test_transaction_larger_than_window_drains_whole_in_flat_memory(
    source: Source, tmp_path: Path
) -> None:
    source.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    args = ("--max-window-bytes", str(1 << 20), "--batch-rows", "5000", "--no-materialize")
    fill = "INSERT INTO t SELECT g, repeat(md5(g::text), 10) FROM generate_series(%s::int, %s) g"
    lake_root = str(tmp_path / "lake")
    source.sql(fill, (1, 20_000))  # one transaction of 20,000 rows, about 7 MB of WAL
    small = summary(drain_app(source, lake_root, *args))
    source.sql(fill, (20_001, 220_000))  # one of 200,000 rows, about 70 MB: 70 windows' worth
    big = summary(drain_app(source, lake_root, *args))
    assert (small["changes"], big["changes"]) == (20_000, 200_000)
    commits = [w for w in Lake(lake_root, source.slot).windows() if w["changes"]]
    assert [(w["transactions"], w["changes"]) for w in commits] == [(1, 20_000), (1, 200_000)]
    rows = changelog(lake_root, TableRef("public", "t"))
    assert len({r["_commit_lsn"] for r in rows if r["id"] > 20_000}) == 1
    # Held whole, the 200,000 decoded rows alone would take well over 100 MB in the driver.
    assert big["peak_rss_mb"] < small["peak_rss_mb"] + 40, (small, big)
    # Empty windows grow geometrically, so the big transaction is reached in a few windows.
    assert big["windows"] < 12, big


@pytest.mark.spark
def test_refuses_before_spark_starts(
    source: Source, tmp_path: Path, pg_tool: Callable[[str], Path]
) -> None:
    lake_root = str(tmp_path / "lake")
    missing = Source(source.cluster, source.db, "no_such_slot", "p")
    result = drain_app(missing, lake_root)
    assert result.returncode == 1 and "'no_such_slot' does not exist" in result.stderr
    source.sql("SELECT pg_create_logical_replication_slot('td_slot', 'test_decoding')")
    try:
        wrong = drain_app(Source(source.cluster, source.db, "td_slot", "p"), lake_root)
        assert wrong.returncode == 1 and "uses output plugin 'test_decoding'" in wrong.stderr
    finally:
        source.sql("SELECT pg_drop_replication_slot('td_slot')")
    consumer = subprocess.Popen(
        [str(pg_tool("pg_recvlogical")), "-d", source.dsn, "--slot", source.slot, "--start",
         "--no-loop", "-o", "proto_version=1", "-o", "publication_names=p", "-f", os.devnull],
    )  # fmt: skip
    try:
        from airflow_pglogrepl.testing.wait import wait_until

        wait_until(lambda: source.hook().get_slot(source.slot).active, what="consumer attached")
        busy = drain_app(source, lake_root)
        assert busy.returncode == 1 and "is active in backend PID" in busy.stderr
        assert "JVM" not in busy.stderr and "SparkContext" not in busy.stderr
    finally:
        consumer.terminate()
        consumer.wait(timeout=30)
        wait_until(lambda: not source.hook().get_slot(source.slot).active, what="released")
    assert not Path(lake_root).exists()


# A commit record right after a WAL page's header, with the window's end inside that header.


class ServerLikeSource(FakeSource):
    """Peeks as the server reads WAL: whole transactions, those whose commit record starts at or
    after the slot's position (the server skips the others), until a record ends at or past
    ``upto_lsn``; ``upto_nchanges`` ends the peek after the transaction that reaches it.

    Records are contiguous except at page headers: when ``upto_lsn`` lies inside a page's
    header, the record before ends at the page's start, before ``upto_lsn``, so the record right
    after the header is read too, and a commit there comes back although it starts past
    ``upto_lsn``."""

    def peek_changes(
        self, slot: str, *, upto_lsn: LSN | str | None, options: Mapping[str, str],
        batch_rows: int = 5000, upto_nchanges: int | None = None,
    ) -> Iterator[tuple[LSN, int | None, Any]]:  # fmt: skip
        start = self.slot.confirmed_flush_lsn
        assert start is not None and upto_lsn is not None
        upto = int(LSN(upto_lsn))
        page = upto - upto % WAL_PAGE
        in_header = 0 < upto - page <= PAGE_HEADER
        returned = 0
        transaction: list[tuple[LSN, int | None, Any]] = []
        for row in self.rows:
            transaction.append(row)
            if row[2][:1] != b"C":
                continue
            commit = int.from_bytes(row[2][2:10], "big")
            if commit >= upto and not (in_header and commit == page + PAGE_HEADER):
                return
            if commit >= int(start):
                yield from transaction
                returned += len(transaction)
                if upto_nchanges is not None and returned >= upto_nchanges:
                    return
            transaction = []


def page_straddle() -> Session:
    """Three transactions of one insert each, committed at 0x1100, 0x2018 (page 0x2000's
    offset 24, right after its header) and 0x2900. A commit row's LSN is its record's end, as
    the server gives it; each transaction describes the table again, as a new decoding session
    would."""
    session = Session(start=0x1000)
    items = relation(16384, "items", [("id", INT8, True), ("name", TEXT)])
    for xid, (commit, end, key) in enumerate([(0x1100, 0x1108, 1), (0x2018, 0x2040, 2),
                                              (0x2900, 0x2908, 3)]):  # fmt: skip
        session.lsn = commit - 0x80
        session.begin(700 + xid, commit).add(items).insert(16384, str(key).encode(), b"v")
        session.lsn = end - 0x10
        session.commit(commit, end)
    return session


def stored_keys(lake: Lake) -> list[tuple[int, int]]:
    rows = read_table(lake.paths.changes(TableRef("public", "items"))).to_pylist()
    return sorted((r["id"], r["_commit_lsn"]) for r in rows)


@pytest.mark.parametrize("columnar", [False, True])
def test_a_commit_read_past_the_window_end_is_stored_once(tmp_path: Path, columnar: bool) -> None:
    """The first window ends at 0x2008, inside page 0x2000's header: its peek also returns the
    transaction committed at 0x2018. The window must end just past that commit; ended at
    0x2008, the slot would stand before the commit and the next run would store it again."""
    source = ServerLikeSource(page_straddle().rows, confirmed=0x1000, flush=0x3000)
    lake = Lake(str(tmp_path / "lake"), "s")
    for max_windows in (1, None):
        Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x1008,
              max_windows=max_windows, columnar=columnar).run(time.monotonic())  # fmt: skip
    assert stored_keys(lake) == [(1, 0x1100), (2, 0x2018), (3, 0x2900)]
    assert source.advances == [LSN(0x2019), LSN(0x3000)]
    assert [w["end_lsn"] for w in lake.windows()] == ["0/2019", "0/3000"]


def test_up_to_the_next_commit_ends_past_a_commit_read_past_the_run_end(tmp_path: Path) -> None:
    """After an empty window, the next reads up to the next commit, with the run's end as its
    ``upto_lsn``: one inside a page header returns the commit after it, which must end the
    window (0x2019), not the run's end (0x2008)."""
    source = ServerLikeSource(page_straddle().rows, confirmed=0x1200, flush=0x2008)
    lake = Lake(str(tmp_path / "lake"), "s")
    drain = Drain(source=source, lake=lake, slot="s", publications=["p"], max_window_bytes=0x800,
                  columnar=False)  # fmt: skip
    result = drain.run(time.monotonic())
    assert [(int(w.start), int(w.end), w.transactions) for w in result.windows] == [
        (0x1200, 0x1A00, 0), (0x1A00, 0x2019, 1)
    ]  # fmt: skip
    source.flush = LSN(0x3000)
    drain.run(time.monotonic())
    assert stored_keys(lake) == [(2, 0x2018), (3, 0x2900)]
    # and a next commit read before the run's end still ends its window at its record's end
    assert source.advances == [LSN(n) for n in (0x1A00, 0x2019, 0x2819, 0x2908, 0x3000)]


@pytest.mark.parametrize(("columnar", "reader"), [(False, "peek"), (True, "peek"),
                                                  (True, "stream")])  # fmt: skip
def test_a_live_commit_after_a_page_header_the_window_ends_in_is_drained_once(
    source: Source, tmp_path: Path, columnar: bool, reader: str
) -> None:
    """The server's own straddle: a transaction whose commit record starts at page offset 24,
    and a first window ending at the page's start + 8, inside the header. The peek up to there
    returns the transaction; the window must end past its commit, or the next run decodes the
    transaction again and its row lands twice in changes/. The stream ends the window at its
    bound and leaves the transaction, which the server sends again, to the next run."""
    source.sql("CREATE TABLE t (id serial PRIMARY KEY, v text)")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE t")
    commit = commit_after_page_header(source, "INSERT INTO t (v) VALUES ('straddles')")
    start = source.hook().get_slot(source.slot).confirmed_flush_lsn
    assert start is not None
    window = (commit - PAGE_HEADER + 8) - start  # the first window ends inside the header
    lake_root = str(tmp_path / "lake")
    first = drain_only(source, lake_root, window=window, columnar=columnar, max_windows=1,
                       reader=reader)  # fmt: skip
    drain_only(source, lake_root, window=window, columnar=columnar, reader=reader)
    keys = all_changelog_keys(lake_root, [TableRef("public", "t")])
    assert sorted(keys) == sorted(set(keys)), f"stored twice: {sorted(keys)}"
    assert len(keys) == len(source.sql("SELECT id FROM t"))
    end = commit + 1 if reader == "peek" else start + window
    assert first.reader == reader and first.windows[0].end == end
    assert first.confirmed_after == end
