"""A run's opened Delta tables (``lake.opened_tables``): inside a scope a table's log is read
once and each later open brings the same table up to date; what the process removes is opened
afresh, from any thread, so a table written again at the same place is never read on top of the
one removed; outside a scope, and in a thread the scope did not hand its tables to, every open
reads the log."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_pglogrepl.lake import delta, opened_tables, staging


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times each table's log was read (``delta._load`` of its newest version)."""
    counted: Counter[str] = Counter()
    load = delta._load

    def counting(uri: str, version: int | None = None) -> Any:
        if version is None:
            counted[uri] += 1
        return load(uri, version)

    monkeypatch.setattr(delta, "_load", counting)
    return counted


def append(uri: str, ids: list[int], mode: str = "append") -> None:
    write_deltalake(uri, pa.table({"id": pa.array(ids, pa.int64())}), mode=mode)  # type: ignore[arg-type]


def ids(table: Any) -> list[int]:
    return sorted(table.to_pyarrow_table().column("id").to_pylist())


def test_outside_a_scope_every_open_reads_the_log(tmp_path: Path, loads: Counter[str]) -> None:
    uri = str(tmp_path / "t")
    append(uri, [1])
    first, second = delta.open_table(uri), delta.open_table(uri)
    assert first is not second
    assert loads[uri] == 2


def test_inside_a_scope_a_table_is_read_once_and_brought_up_to_date(
    tmp_path: Path, loads: Counter[str]
) -> None:
    uri = str(tmp_path / "t")
    append(uri, [1])
    with opened_tables.reused():
        table = delta.open_table(uri)
        assert table is not None and table.version() == 0
        append(uri, [2])  # another commit of this process, by another table object
        again = delta.open_table(uri)
        assert again is table
        assert again.version() == 1 and ids(again) == [1, 2]
        with opened_tables.reused():  # a scope inside: the outer one's tables
            assert delta.open_table(uri) is table
        assert delta.open_table(str(tmp_path / "missing")) is None
        assert delta.open_table(str(tmp_path / "missing")) is None  # (no table: not kept)
    assert loads == {uri: 1, str(tmp_path / "missing"): 2}
    assert delta.open_table(uri) is not table  # the scope is over


def test_a_commit_made_through_the_kept_table_keeps_it(
    tmp_path: Path, loads: Counter[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A merge or an append through the object moves it to its new version itself."""
    uri = str(tmp_path / "t")
    append(uri, [1])
    with opened_tables.reused():
        table = delta.open_table(uri)
        write_deltalake(table, pa.table({"id": pa.array([2], pa.int64())}), mode="append")  # type: ignore[arg-type]
        assert table is not None and table.version() == 1
        append(uri, [3])  # and one through another object
        assert delta.open_table(uri) is table and ids(table) == [1, 2, 3]
        assert delta.open_table(uri) is table
    assert loads[uri] == 1
    assert "changed under the run" not in caplog.text


def test_a_table_removed_and_written_again_is_not_read_on_top_of_the_old_one(
    tmp_path: Path, loads: Counter[str]
) -> None:
    uri = str(tmp_path / "state" / "public.t")
    append(uri, [1])
    append(uri, [2])
    with opened_tables.reused():
        assert ids(delta.open_table(uri)) == [1, 2]
        staging.remove(str(tmp_path / "state"))  # what a new snapshot does with an old table
        for row in (10, 11, 12):  # more versions than the old table had
            append(uri, [row])
        table = delta.open_table(uri)
        assert table is not None and table.version() == 2
        assert ids(table) == [10, 11, 12]
    assert loads[uri] == 2


def test_a_removal_in_another_thread_is_seen_at_the_next_open(
    tmp_path: Path, loads: Counter[str]
) -> None:
    uri = str(tmp_path / "t")
    append(uri, [1])
    with opened_tables.reused():
        delta.open_table(uri)
        remover = threading.Thread(target=staging.remove, args=(uri,))
        remover.start()
        remover.join()
        append(uri, [5])
        assert ids(delta.open_table(uri)) == [5]
    assert loads[uri] == 2


def test_a_thread_keeps_only_the_tables_its_scope_hands_it(
    tmp_path: Path, loads: Counter[str]
) -> None:
    uri = str(tmp_path / "t")
    append(uri, [1])
    opened: dict[str, Any] = {}

    def in_thread(key: str, tables: opened_tables.Opened | None) -> None:
        with opened_tables.reused(tables):
            opened[key] = delta.open_table(uri)

    assert opened_tables.for_another_thread() is None
    with opened_tables.reused():
        mine = delta.open_table(uri)
        handed = opened_tables.for_another_thread()
        assert handed is not None and handed is opened_tables.for_another_thread()
        for key, tables in (("plain", None), ("handed", handed), ("handed again", handed)):
            thread = threading.Thread(target=in_thread, args=(key, tables))
            thread.start()
            thread.join()
    assert opened["plain"] is not mine and opened["handed"] is not mine
    assert opened["handed again"] is opened["handed"]
    assert loads[uri] == 3  # the scope's, the plain thread's, the handed tables' first


def test_the_least_recently_opened_table_goes_past_the_bound(
    tmp_path: Path, loads: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(opened_tables, "KEPT", 2)
    uris = [str(tmp_path / name) for name in "abc"]
    for uri in uris:
        append(uri, [1])
    with opened_tables.reused():
        for uri in [*uris, uris[2], uris[0]]:
            delta.open_table(uri)
    assert loads == {uris[0]: 2, uris[1]: 1, uris[2]: 1}


def test_a_table_whose_update_fails_is_opened_afresh(
    tmp_path: Path, loads: Counter[str], caplog: pytest.LogCaptureFixture
) -> None:
    uri = str(tmp_path / "t")
    append(uri, [1])

    def failing() -> None:
        raise OSError("log unreadable")

    with opened_tables.reused():
        first = delta.open_table(uri)
        first.update_incremental = failing  # type: ignore[union-attr]
        second = delta.open_table(uri)
    assert second is not first and loads[uri] == 2
    assert "bringing it up to date failed (log unreadable)" in caplog.text


def test_a_table_written_again_by_someone_else_during_the_run_is_opened_afresh(
    tmp_path: Path, loads: Counter[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Not through ``staging.remove``: a person or another tool, while the run holds the lock.
    The new table has the kept version and more, with other files."""
    import shutil

    uri = str(tmp_path / "t")
    append(uri, [1])
    append(uri, [2])
    with opened_tables.reused():
        assert ids(delta.open_table(uri)) == [1, 2]
        shutil.rmtree(uri)
        for row in (10, 11, 12, 13):
            append(uri, [row])
        assert ids(delta.open_table(uri)) == [10, 11, 12, 13]
    assert loads[uri] == 2
    assert "changed under the run (its commit file of version 1 is not the one read)" in (
        caplog.text
    )


def test_a_table_opened_while_it_is_removed_is_not_kept_past_the_removal(
    tmp_path: Path, loads: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread's scope may open the table between the removal's start and its end."""
    import shutil

    uri = str(tmp_path / "t")
    append(uri, [1])
    append(uri, [2])
    remove = shutil.rmtree

    def opened_meanwhile(path: str, *args: Any, **kwargs: Any) -> None:
        delta.open_table(uri)  # (in this scope, for the test: the order is what matters)
        remove(path, *args, **kwargs)

    with opened_tables.reused():
        monkeypatch.setattr(shutil, "rmtree", opened_meanwhile)
        staging.remove(uri)
        monkeypatch.setattr(shutil, "rmtree", remove)
        for row in (10, 11, 12):
            append(uri, [row])
        assert ids(delta.open_table(uri)) == [10, 11, 12]


def test_a_thread_that_inherits_the_context_does_not_use_the_scope(
    tmp_path: Path, loads: Counter[str]
) -> None:
    """Free-threaded Python from 3.14 gives a new thread a copy of its creator's context."""
    import contextvars

    uri = str(tmp_path / "t")
    append(uri, [1])
    opened: list[Any] = []
    with opened_tables.reused():
        mine = delta.open_table(uri)
        context = contextvars.copy_context()
        thread = threading.Thread(target=context.run, args=(lambda: opened.append(
            (delta.open_table(uri), opened_tables.for_another_thread())),))  # fmt: skip
        thread.start()
        thread.join()
    assert opened[0][0] is not mine and opened[0][1] is None
    assert loads[uri] == 2


def test_a_table_of_more_files_than_the_budget_is_not_kept(
    tmp_path: Path, loads: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(opened_tables, "KEPT_FILES", 2)
    small, big = str(tmp_path / "small"), str(tmp_path / "big")
    append(small, [1])
    for row in (1, 2, 3):
        append(big, [row])
    with opened_tables.reused():
        for uri in (small, big, small, big):
            delta.open_table(uri)
    assert loads == {small: 1, big: 2}


def test_a_scope_too_far_behind_the_removals_drops_every_table(
    tmp_path: Path, loads: Counter[str]
) -> None:
    uri = str(tmp_path / "t")
    append(uri, [1])
    with opened_tables.reused():
        delta.open_table(uri)
        for n in range(opened_tables._removed.maxlen or 0):
            opened_tables.forget(f"{tmp_path}/elsewhere-{n}")
        opened_tables.forget(f"{tmp_path}/elsewhere-last")
        delta.open_table(uri)
    assert loads[uri] == 2


def test_a_read_of_the_version_just_opened_reuses_the_opened_table(
    tmp_path: Path, loads: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "t")
    append(uri, [1])
    append(uri, [2])
    versioned: list[int | None] = []
    load = delta._load

    def counting(u: str, version: int | None = None) -> Any:
        versioned.append(version)
        return load(u, version)

    with opened_tables.reused():
        table = delta.open_table(uri)
        assert table is not None and table.version() == 1
        monkeypatch.setattr(delta, "_load", counting)
        assert sorted(delta.read_table(uri, version=1).column("id").to_pylist()) == [1, 2]
        assert versioned == []  # the opened table, at that version
        assert delta.read_table(uri, version=0).column("id").to_pylist() == [1]
        assert versioned == [0]
