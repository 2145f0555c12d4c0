"""The sink's commit protocol on local disk: visible exactly once, whatever step a crash hits."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.spark.sink import CommitRecord, Sink, table_dir, table_from_dir, window_id
from airflow_pglogrepl.spark.storage import LocalStorage
from airflow_pglogrepl.tables import TableRef

T = TableRef("public", "orders")


@given(st.text(min_size=1), st.text(min_size=1))
def test_table_dir_round_trips_and_is_safe(schema: str, name: str) -> None:
    ref = TableRef(schema, name)
    directory = table_dir(ref)
    assert table_from_dir(directory) == ref
    assert "/" not in directory and "=" not in directory and directory.count(".") == 1
    assert not directory.startswith(("_", "."))


@pytest.mark.parametrize(
    ("schema", "name", "expected"),
    [("public", "orders", "public.orders"), ("_hidden", "t", "%5Fhidden.t"),
     ("a.b", "c/d=e", "a%2Eb.c%2Fd%3De"), ("s", "_t", "s.%5Ft")],
)  # fmt: skip
def test_table_dir_examples(schema: str, name: str, expected: str) -> None:
    assert table_dir(TableRef(schema, name)) == expected
    assert table_from_dir(expected) == TableRef(schema, name)


def test_window_ids_sort_by_lsn() -> None:
    ids = [window_id(LSN(x)) for x in ("0/FFFFFFFF", "1/0", "A/0", "0/10")]
    assert sorted(ids) == [window_id(LSN(x)) for x in ("0/10", "0/FFFFFFFF", "1/0", "A/0")]


def _stage(sink: Sink, end: str, names: tuple[str, ...] = ("part-0.parquet",)) -> CommitRecord:
    window = window_id(LSN(end))
    for name in names:
        path = Path(sink.staging_dir(window, T)) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"data of {window}/{name}")
    return CommitRecord(
        kind="window", slot="s", start_lsn="0/0", end_lsn=end, transactions=1, changes=2,
        files=sink.staged_files(window),
    )  # fmt: skip


def _published(sink: Sink) -> list[str]:
    return sorted(p.name for p in Path(sink.changes_dir(T)).glob("*"))


@pytest.fixture
def sink(tmp_path: Path) -> Sink:
    return Sink(str(tmp_path / "lake"), LocalStorage())


def test_commit_publishes_and_records(sink: Sink) -> None:
    record = _stage(sink, "0/100", ("part-0.parquet", "part-1.parquet"))
    assert record.files == {"public.orders": ["part-0.parquet", "part-1.parquet"]}
    sink.commit(record)
    window = window_id(LSN("0/100"))
    assert _published(sink) == [f"{window}-part-0.parquet", f"{window}-part-1.parquet"]
    assert not Path(sink.staging_dir(window)).exists()
    assert sink.last_commit() == record
    assert sink.recover() == record  # nothing left to do
    assert len(_published(sink)) == 2


def test_crash_before_the_record_leaves_nothing_visible(sink: Sink) -> None:
    _stage(sink, "0/100")  # written, never committed: the process died here
    assert sink.recover() is None
    assert _published(sink) == []
    assert not Path(sink.staging_dir(window_id(LSN("0/100")))).exists()


def test_crash_after_the_record_is_finished_by_recover(
    sink: Sink, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _stage(sink, "0/100", ("a.parquet", "b.parquet"))
    moves: list[str] = []
    original = LocalStorage.move

    def dying_move(self: LocalStorage, src: str, dst: str) -> None:
        if moves:
            raise KeyboardInterrupt("killed mid-publish")
        moves.append(src)
        original(self, src, dst)

    monkeypatch.setattr(LocalStorage, "move", dying_move)
    with pytest.raises(KeyboardInterrupt):
        sink.commit(first)
    monkeypatch.setattr(LocalStorage, "move", original)
    assert len(_published(sink)) == 1
    assert sink.recover() == first
    assert len(_published(sink)) == 2  # both files once, none twice
    assert sink.recover() == first and len(_published(sink)) == 2


def test_commits_are_read_in_lsn_order(sink: Sink) -> None:
    for end in ("1/0", "0/200", "0/FFFFFFFF"):
        sink.commit(_stage(sink, end))
    assert [r.end_lsn for r in sink.commits()] == ["0/200", "0/FFFFFFFF", "1/0"]
    last = sink.last_commit()
    assert last is not None and last.end == LSN("1/0")


def test_a_committed_file_missing_everywhere_is_reported(sink: Sink) -> None:
    record = _stage(sink, "0/100")
    sink.commit(record)
    for path in Path(sink.changes_dir(T)).glob("*"):
        path.unlink()
    Path(sink.staging_dir(record.window, T)).mkdir(parents=True)
    with pytest.raises(RuntimeError, match="modified by hand"):
        sink.recover()
