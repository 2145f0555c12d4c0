"""Replay and time travel by LSN (``lake.replay``) against the changelog itself.

Lakes are written through the drain's own window API and merged by the merge without a JVM
(``merge.arrow``), from random workloads whose every change the test keeps: a range of
changes must equal the whole changelog filtered by commit LSN, consecutive ranges must add up to
the whole changelog, and a state as of a position must equal the changelog replayed up to it,
or be refused exactly where the lake holds no state there. Every refusal is provoked. Then live:
a real PostgreSQL drained in several runs and merged on Spark (deletion vectors), where the state
as of each run's position must equal the source's rows when that run drained.
"""

from __future__ import annotations

import datetime as dt
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from airflow_pglogrepl.changelog.columns import (
    COMMIT_LSN,
    OP,
    SEQ,
    mark_keys,
    meta_fields,
)
from airflow_pglogrepl.exceptions import ReplayRangeError, TableNotInLakeError
from airflow_pglogrepl.lake import delta, schema_commits, storage
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.layout import app_id, table_dir
from airflow_pglogrepl.lake.replay import (
    changes_between,
    changes_between_spark,
    state_as_of,
    state_as_of_spark,
)
from airflow_pglogrepl.lake.txnlog import HistoryExpiredError
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.merge import arrow as arrow_merge
from airflow_pglogrepl.merge.materialize import materialize
from airflow_pglogrepl.tables import TableRef
from tests.support.drain import drain_only, normalize
from tests.support.sources import Source

SLOT = "slot_r"
APP = app_id(SLOT)
PLAIN = TableRef("public", "a")
HOSTILE = TableRef('we"ird.sch/ema', 'tä.b"le/ü 1')
TABLES = (PLAIN, HOSTILE)
BEGIN = 0x1000
BASE = [pa.field("id", pa.int64()), pa.field("v", pa.int64())]
SCHEMA = pa.schema([*mark_keys(BASE, ["id"]), *meta_fields(BASE, "d")])
STATE = pa.schema(mark_keys(BASE, ["id"]))  # as a snapshot writes it: the key marked


@dataclass
class Built:
    """A lake begun by a snapshot at ``BEGIN`` (empty states), then random windows of random
    transactions over both tables, merged at random window ends: every changelog row written,
    every window end and every position each table's state was merged at, kept."""

    root: str
    lake: Lake
    rows: dict[TableRef, list[dict[str, Any]]] = field(default_factory=dict)
    ends: list[int] = field(default_factory=list)
    merged: dict[TableRef, list[int]] = field(default_factory=dict)

    @property
    def position(self) -> int:
        return self.ends[-1]

    def changelog(self, table: TableRef, start: int = 0, end: int = 1 << 63) -> list[Any]:
        """What the lake must give for ``[start, end)``: the rows in commit order."""
        ordered = sorted(self.rows[table], key=lambda r: (r[COMMIT_LSN], r[SEQ]))
        return [r for r in ordered if start <= r[COMMIT_LSN] < end]

    def state_at(self, table: TableRef, position: int) -> list[tuple[int, int]]:
        """The changelog replayed up to ``position``."""
        live: dict[int, int] = {}
        for row in self.changelog(table, 0, position):
            if row[OP] == "D":
                live.pop(row["id"], None)
            else:
                live[row["id"]] = row["v"]
        return sorted(live.items())

    def readable(self, table: TableRef, position: int) -> bool:
        """Whether the lake holds ``table``'s state at ``position``: merged at a position at or
        below it, with no change of the table from there to it."""
        merged = max(p for p in self.merged[table] if p <= position)
        return not self.changelog(table, merged, position)


def write_state(root: str, table: TableRef, at: int, rows: pa.Table | None = None) -> None:
    """A whole state of ``table`` as one version at ``at`` (a snapshot's)."""
    commit = CommitProperties(app_transactions=[Transaction(APP, at)])
    uri = f"{root}/state/{table_dir(table)}"
    write_deltalake(uri, STATE.empty_table() if rows is None else rows, mode="overwrite",
                    commit_properties=commit,
                    storage_options=storage.delta_options(uri))  # fmt: skip


def build(root: Path, seed: int, windows: int = 30) -> Built:
    rng = random.Random(seed)
    built = Built(str(root), Lake(str(root), SLOT))
    lake = built.lake
    for table in TABLES:
        write_state(built.root, table, BEGIN)
        built.rows[table], built.merged[table] = [], [BEGIN]
    lake.record(kind="snapshot", start=LSN(BEGIN), end=LSN(BEGIN))
    built.ends.append(BEGIN)
    live: dict[TableRef, dict[int, int]] = {t: {} for t in TABLES}
    lsn, seq, next_id = BEGIN, 0, 1
    for _ in range(windows):
        window = Window(lake, LSN(built.position))
        pending: dict[TableRef, list[dict[str, Any]]] = {t: [] for t in TABLES}
        for xid in range(rng.choice([0, 1, 2, 3, 5])):
            lsn += rng.randrange(1, 100)
            for _ in range(rng.randrange(1, 4)):
                table = rng.choice(TABLES)
                ids = live[table]
                op = rng.choice("IUD") if ids else "I"
                if op == "I":
                    key, next_id = next_id, next_id + 1
                else:
                    key = rng.choice(sorted(ids))
                value = None if op == "D" else rng.randrange(1000)
                if value is None:
                    ids.pop(key)
                else:
                    ids[key] = value
                seq += 1
                pending[table].append({"id": key, "v": value, OP: op, COMMIT_LSN: lsn,
                                       SEQ: seq, "_xid": xid, "_commit_ts": dt.datetime.now(dt.UTC),
                                       "_unchanged": None, "_old": None})  # fmt: skip
        for table, rows in pending.items():
            for part in (rows[: len(rows) // 2], rows[len(rows) // 2 :]):  # files of one window
                if part:
                    window.write(table, pa.Table.from_pylist(part, schema=SCHEMA))
            built.rows[table] += rows
        lsn += rng.randrange(1, 50)
        window.commit(LSN(lsn), transactions=0, changes=0)
        built.ends.append(lsn)
        if rng.random() < 0.35:
            for table in TABLES:
                why = arrow_merge.merge_table(lake, table_dir(table), LSN(lsn))
                assert why in (None, "0 changes", "no changelog"), why
                # (a merge that changes no row, say an insert and a delete of one key, commits
                # nothing through delta-rs: the state then stays at its earlier position)
                if lake.state_version(table) == LSN(lsn):
                    built.merged[table].append(lsn)
    return built


@pytest.fixture(scope="module", params=[1, 2, 3])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(tmp_path_factory.mktemp("lake") / "lake", request.param)


def plain(rows: pa.Table) -> list[dict[str, Any]]:
    return rows.to_pylist()


def test_the_built_lake_is_what_the_test_thinks(built: Built) -> None:
    assert [int(LSN(w["end_lsn"])) for w in built.lake.windows()] == built.ends
    for table in TABLES:
        whole = delta.read_table(built.lake.paths.changes(table))
        assert whole.num_rows == len(built.rows[table]) > 0
        assert len(built.merged[table]) > 1, "no merge: the state tests would test nothing"


@pytest.mark.parametrize("table", TABLES, ids=["plain", "hostile"])
def test_a_range_is_the_changelog_filtered_by_commit_lsn(built: Built, table: TableRef) -> None:
    rng = random.Random(str(table))
    bounds = [*built.ends, *(rng.randrange(BEGIN, built.position + 1) for _ in range(30))]
    for _ in range(25):
        start, end = sorted(rng.sample(bounds, 2))
        got = changes_between(built.root, table, LSN(start), str(LSN(end)))
        assert plain(got) == built.changelog(table, start, end), (LSN(start), LSN(end))
        assert got.schema.names == SCHEMA.names
    assert plain(changes_between(built.root, table, BEGIN, built.position)) == built.changelog(
        table
    )


@pytest.mark.parametrize("table", TABLES, ids=["plain", "hostile"])
def test_consecutive_ranges_add_up_to_the_whole_changelog(built: Built, table: TableRef) -> None:
    parts = [changes_between(built.root, table, LSN(a), LSN(b), slot=SLOT)
             for a, b in zip(built.ends, built.ends[1:], strict=False)]  # fmt: skip
    assert sum(p.num_rows for p in parts) == len(built.rows[table])
    assert plain(pa.concat_tables(parts)) == built.changelog(table)
    whole = delta.read_table(built.lake.paths.changes(table)).to_pylist()
    keys = [(r[COMMIT_LSN], r[SEQ]) for p in parts for r in p.to_pylist()]
    assert sorted(keys) == keys == sorted((r[COMMIT_LSN], r[SEQ]) for r in whole)


@pytest.mark.parametrize("table", TABLES, ids=["plain", "hostile"])
def test_the_state_as_of_a_position_is_the_changelog_replayed_up_to_it(
    built: Built, table: TableRef
) -> None:
    refused = 0
    for end in built.ends:
        if built.readable(table, end):
            got = state_as_of(built.root, table, str(LSN(end)))
            assert sorted((r["id"], r["v"]) for r in got.to_pylist()) == built.state_at(
                table, end
            ), LSN(end)
        else:
            refused += 1
            with pytest.raises(ReplayRangeError, match="was not merged at") as caught:
                state_as_of(built.root, table, LSN(end))
            before = max(p for p in built.ends if p < end and built.readable(table, p))
            assert f"{LSN(before)} (before)" in str(caught.value)
    assert refused, "every position readable: the lagging case went untested"


# -- refusals ------------------------------------------------------------------------------------


def test_ranges_the_lake_does_not_hold_are_refused(built: Built) -> None:
    root, end = built.root, built.position
    with pytest.raises(ReplayRangeError, match="starts after it ends") as caught:
        changes_between(root, PLAIN, end, end - 1)
    assert str(PLAIN) in str(caught.value)
    with pytest.raises(ReplayRangeError, match=f"position is {LSN(end)}") as caught:
        changes_between(root, HOSTILE, BEGIN, end + 1)
    message = str(caught.value)
    assert str(HOSTILE) in message and str(LSN(end + 1)) in message
    assert f"[{LSN(BEGIN)}, {LSN(end)})" in message and "drain first" in message
    with pytest.raises(ReplayRangeError, match=f"begins at {LSN(BEGIN)}"):
        changes_between(root, PLAIN, BEGIN - 1, end)
    assert changes_between(root, PLAIN, end, end).num_rows == 0
    below, above = next((a, b) for a, b in zip(built.ends, built.ends[1:], strict=False)
                        if b - a > 1)  # fmt: skip
    with pytest.raises(ReplayRangeError, match="no committed window end") as caught:
        state_as_of(root, PLAIN, below + 1)
    assert f"{LSN(below)} and {LSN(above)}" in str(caught.value)
    with pytest.raises(ReplayRangeError, match=f"position is {LSN(end)}"):
        state_as_of(root, PLAIN, end + 1)


def test_an_unknown_table_is_refused_with_what_the_lake_holds(built: Built) -> None:
    for call in (lambda t: changes_between(built.root, t, BEGIN, BEGIN),
                 lambda t: state_as_of(built.root, t, BEGIN)):  # fmt: skip
        with pytest.raises(TableNotInLakeError, match=r"no table public\.nope") as caught:
            call(TableRef("public", "nope"))
        assert table_dir(HOSTILE) in str(caught.value)


def test_a_lake_without_windows_is_refused(tmp_path: Path) -> None:
    write_state(str(tmp_path), PLAIN, BEGIN)
    with pytest.raises(ReplayRangeError, match="holds no committed window"):
        changes_between(str(tmp_path), PLAIN, BEGIN, BEGIN, slot=SLOT)


class Small:
    """A small lake built by hand, window by window: ``change`` adds a row of ``table`` at a
    commit LSN, ``window`` commits what was added up to an end."""

    def __init__(self, root: Path | str) -> None:
        self.root = str(root)
        self.lake = Lake(self.root, SLOT)
        self.end = BEGIN
        self.seq = 0
        self.window = Window(self.lake, LSN(BEGIN))

    def reopen(self) -> None:
        """A new run's view of the lake (what it caches of the tables is read again)."""
        self.lake = Lake(self.root, SLOT)
        self.window = Window(self.lake, LSN(self.end))

    def change(self, table: TableRef, lsn: int, key: int, op: str = "I") -> None:
        self.seq += 1
        row = {"id": key, "v": key, OP: op, COMMIT_LSN: lsn, SEQ: self.seq}
        self.window.write(table, pa.Table.from_pylist([row], schema=SCHEMA))

    def commit(self, end: int) -> None:
        self.window.commit(LSN(end), transactions=0, changes=0)
        self.end = end
        self.window = Window(self.lake, LSN(end))

    def merge(self, table: TableRef) -> None:
        position = self.lake.position()
        assert position is not None
        assert arrow_merge.merge_table(self.lake, table_dir(table), position) is None

    def lsns(self, table: TableRef, start: int, end: int) -> list[int]:
        return changes_between(self.root, table, start, end).column(COMMIT_LSN).to_pylist()


def test_rows_a_crashed_run_committed_past_the_position_are_read(lake_uri: str) -> None:
    """A run that crashed between a table's commit (ending at E) and its windows row, replayed
    with smaller windows: the replay's window below E writes nothing for the table (it holds
    those rows), so the rows of that window sit in the commit above the position."""
    from airflow_pglogrepl.lake import delta

    small = Small(lake_uri)
    small.change(PLAIN, BEGIN + 0x50, 1)
    small.commit(BEGIN + 0x100)
    crashed = Window(small.lake, LSN(BEGIN + 0x100))
    for key, lsn in ((2, BEGIN + 0x150), (3, BEGIN + 0x250)):
        row = {"id": key, "v": key, OP: "I", COMMIT_LSN: lsn, SEQ: key}
        crashed.write(PLAIN, pa.Table.from_pylist([row], schema=SCHEMA))
    pending = crashed._pending[table_dir(PLAIN)]
    delta.commit_files(
        small.lake.paths.changes(PLAIN),
        pending.schema,
        pending.files,
        app=small.lake.app,
        version=BEGIN + 0x300,
        expected=BEGIN + 0x100,
    )  # fmt: skip  (then the run dies)
    small.reopen()
    small.change(PLAIN, BEGIN + 0x150, 2)  # the replay's smaller window: held, not written
    small.commit(BEGIN + 0x200)
    assert small.lsns(PLAIN, BEGIN, BEGIN + 0x200) == [BEGIN + 0x50, BEGIN + 0x150]


@pytest.mark.parametrize("restarted", [True, False], ids=["restarted", "kept"])
def test_a_range_over_a_re_snapshot_is_refused_and_the_ranges_beside_it_are_read(
    lake_uri: str, restarted: bool
) -> None:
    small = Small(lake_uri)
    write_state(small.root, HOSTILE, BEGIN)
    small.lake.record(kind="snapshot", start=LSN(BEGIN), end=LSN(BEGIN))
    small.change(HOSTILE, 0x1010, 1)
    small.commit(0x1100)
    small.commit(0x1200)  # the re-snapshot is taken here, at 0x1250 (no window end)
    write_state(small.root, HOSTILE, 0x1250, pa.table({"id": [1, 2], "v": [1, 2]}))
    if restarted:
        schema_commits.reset_table(
            small.lake.paths.changes(HOSTILE), SCHEMA, app=APP, version=0x1250
        )
    small.reopen()
    small.change(HOSTILE, 0x1240, 2)  # in the state already: the window drops it
    small.change(HOSTILE, 0x1260, 3)
    small.commit(0x1300)
    assert small.lsns(HOSTILE, BEGIN, 0x1100) == [0x1010]  # read before the restart
    assert small.lsns(HOSTILE, 0x1250, 0x1300) == [0x1260]
    for start, end in ((BEGIN, 0x1300), (0x1100, 0x1300), (0x1249, 0x1251)):
        with pytest.raises(ReplayRangeError, match="re-snapshotted at 0/1250") as caught:
            changes_between(small.root, HOSTILE, start, end)
        message = str(caught.value)
        assert "[0/1100, 0/1250)" in message, message  # the gap: its last change's window on
        assert "[0/1000, 0/1100) and in [0/1250, 0/1300)" in message
        assert str(HOSTILE) in message and "Fix:" in message


def test_a_range_before_a_vacuumed_restart_has_expired(tmp_path: Path) -> None:
    small = Small(tmp_path / "lake")
    write_state(small.root, PLAIN, BEGIN)
    small.lake.record(kind="snapshot", start=LSN(BEGIN), end=LSN(BEGIN))
    small.change(PLAIN, 0x1010, 1)
    small.commit(0x1100)
    write_state(small.root, PLAIN, 0x1150, pa.table({"id": [1], "v": [1]}))
    uri = small.lake.paths.changes(PLAIN)
    schema_commits.reset_table(uri, SCHEMA, app=APP, version=0x1150)
    small.reopen()
    small.commit(0x1200)
    assert small.lsns(PLAIN, BEGIN, 0x1100) == [0x1010]
    DeltaTable(uri).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(HistoryExpiredError, match=r"changes in \[0/1000, 0/1100\).*VACUUM"):
        changes_between(small.root, PLAIN, BEGIN, 0x1100)
    assert small.lsns(PLAIN, 0x1150, 0x1200) == []


def test_a_state_older_than_its_log_keeps_has_expired(tmp_path: Path) -> None:
    small = Small(tmp_path / "lake")
    write_state(small.root, PLAIN, BEGIN)
    small.lake.record(kind="snapshot", start=LSN(BEGIN), end=LSN(BEGIN))
    for end in (0x1100, 0x1200, 0x1300):
        small.change(PLAIN, end - 1, end)
        small.commit(end)
        small.merge(PLAIN)
    state = small.lake.paths.state(PLAIN)
    DeltaTable(state, version=2).create_checkpoint()
    for version in (0, 1, 2):  # what log cleanup leaves: the checkpoint at 2, commits after it
        os.remove(Path(state, "_delta_log", f"{version:020d}.json"))
    assert sorted(state_as_of(small.root, PLAIN, 0x1300).column("id").to_pylist()) == [
        0x1100,
        0x1200,
        0x1300,
    ]
    assert state_as_of(small.root, PLAIN, 0x1200).num_rows == 2  # from the checkpoint
    with pytest.raises(HistoryExpiredError, match=r"state as of 0/1100 of public\.a"):
        state_as_of(small.root, PLAIN, 0x1100)
    with pytest.raises(HistoryExpiredError, match=r"changes in \[0/1000, 0/1300\)"):
        changes_between(small.root, PLAIN, BEGIN, 0x1300)  # re-snapshots below: unknown
    assert small.lsns(PLAIN, 0x1200, 0x1300) == [0x12FF]


def test_a_table_the_lake_did_not_hold_yet_is_empty(tmp_path: Path) -> None:
    small = Small(tmp_path / "lake")
    write_state(small.root, PLAIN, BEGIN)
    small.lake.record(kind="snapshot", start=LSN(BEGIN), end=LSN(BEGIN))
    small.commit(0x1100)
    small.change(HOSTILE, 0x1150, 7)
    small.commit(0x1200)
    before = state_as_of(small.root, HOSTILE, 0x1100)
    assert before.num_rows == 0 and before.schema.names == ["id", "v"]
    assert changes_between(small.root, HOSTILE, BEGIN, 0x1100).num_rows == 0
    assert small.lsns(HOSTILE, BEGIN, 0x1200) == [0x1150]
    # a state, no change yet: no rows, with the changelog's columns
    never = changes_between(small.root, PLAIN, BEGIN, 0x1200)
    assert never.num_rows == 0 and never.schema.names == SCHEMA.names
    assert state_as_of(small.root, PLAIN, 0x1200).num_rows == 0


# -- live: a real drain of PostgreSQL, merged on Spark --------------------------------------------

LIVE = TableRef("public", 'Ord"ers.ü/x')


def test_replay_of_a_real_drain_matches_the_source_run_by_run(
    spark: Any, source: Source, tmp_path: Path
) -> None:
    source.sql('CREATE TABLE "Ord""ers.ü/x" (id int PRIMARY KEY, v text)')
    source.sql(f'CREATE PUBLICATION {source.publication} FOR TABLE "Ord""ers.ü/x"')
    lake_root = str(tmp_path / "lake")
    seen: dict[LSN, list[tuple[Any, ...]]] = {}
    for step in range(3):
        source.sql(f"""
            DO $$ BEGIN
              FOR i IN {step * 40 + 1}..{step * 40 + 40} LOOP
                INSERT INTO "Ord""ers.ü/x" VALUES (i, 'v' || i);
                IF i % 3 = 0 THEN UPDATE "Ord""ers.ü/x" SET v = v || '!' WHERE id = i - 2; END IF;
                IF i % 4 = 0 THEN DELETE FROM "Ord""ers.ü/x" WHERE id = i - 1; END IF;
                COMMIT;
              END LOOP;
            END $$""")
        drain_only(source, lake_root, window=2048)
        materialize(spark, Lake(lake_root, source.slot), small_rows=0)  # Spark: deletion vectors
        position = Lake(lake_root, source.slot).position()
        assert position is not None
        rows = source.sql('SELECT id, v FROM "Ord""ers.ü/x"')
        seen[position] = sorted(tuple(normalize(v) for v in r) for r in rows)
    lake = Lake(lake_root, source.slot)
    state = lake.paths.state(LIVE)
    log = "".join(p.read_text() for p in sorted(Path(state, "_delta_log").glob("*.json")))
    assert '"deletionVector":{' in log, "no deletion vector: Spark's merge went untested"
    for position, rows in seen.items():
        got = state_as_of(lake_root, LIVE, position)
        assert sorted((r["id"], r["v"]) for r in got.to_pylist()) == rows, position
        frame = state_as_of_spark(spark, lake_root, LIVE, position)
        assert sorted((r.id, r.v) for r in frame.collect()) == rows, position
    ends = [LSN(w["end_lsn"]) for w in lake.windows()]
    assert len(ends) > 3, "one window per run: the ranges would not cut the changelog"
    whole = delta.read_table(lake.paths.changes(LIVE))
    keys = sorted(zip(whole.column(COMMIT_LSN).to_pylist(), whole.column(SEQ).to_pylist(),
                      strict=True))  # fmt: skip
    first = LSN(lake.windows()[0]["start_lsn"])
    parts = [
        changes_between(lake_root, LIVE, a, b) for a, b in zip([first, *ends], ends, strict=False)
    ]
    assert [(r[COMMIT_LSN], r[SEQ]) for p in parts for r in p.to_pylist()] == keys
    middle = changes_between(lake_root, LIVE, ends[1], ends[-2])
    frame = changes_between_spark(spark, lake_root, LIVE, ends[1], ends[-2])
    assert [(r[COMMIT_LSN], r[SEQ]) for r in frame.select(COMMIT_LSN, SEQ).collect()] == [
        (r[COMMIT_LSN], r[SEQ]) for r in middle.to_pylist()
    ]
    assert 0 < middle.num_rows < len(keys)
    assert set(middle.column(OP).to_pylist()) == {"I", "U", "D"}
