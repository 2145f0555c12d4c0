"""SlotsMixin.peek_changes against a live cluster: the fetch path itself.

The rows must be exactly what the peek functions return (compared with a plain text-format
query), in both fetch modes (libpq's chunked rows, and the server-side cursor kept for older
libpq), for the binary and the text function; the slot must not move; the rows must stream (the
server waits on the client instead of the client buffering the window); a caller that stops
early must leave nothing running.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_pglogrepl.conninfo import make_dsn
from airflow_pglogrepl.exceptions import InvalidSlotNameError, SlotNotFoundError
from airflow_pglogrepl.hooks.replication import DsnReplicationHook
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import Change, PgOutputStream, TransactionCommit
from airflow_pglogrepl.postgres import slots as slots_module
from airflow_pglogrepl.testing.pgcluster import PgCluster
from airflow_pglogrepl.testing.wait import wait_until

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion

DB = "peek_fetch"
APP = "peek-fetch-test"
# A publication name that would break any query built by pasting it in: quotes, a comma, a
# semicolon. publication_names is a list of identifiers, so it is double-quoted there.
PUBLICATION = 'pub\'; SELECT 1; --, "x"'
SLOT = "peek_fetch_pgoutput"
SLOT_TD = "peek_fetch_td"
BIG_ROWS = 300_000  # ~25 MB of pgoutput rows: more than the socket buffers hold


@dataclass
class Fetch:
    cluster: PgCluster
    small_end: LSN  # after the small, mixed workload; the big load follows

    @property
    def options(self) -> dict[str, str]:
        quoted = '"' + PUBLICATION.replace('"', '""') + '"'
        return {"proto_version": "1", "publication_names": quoted}

    def hook(self) -> DsnReplicationHook:
        return DsnReplicationHook(make_dsn(self.cluster.params(DB, application_name=APP)))

    def reference(
        self, function: str, slot: str, options: dict[str, str], upto: LSN | None, nchanges: Any
    ) -> list[tuple[LSN, int, Any]]:
        """The same peek through a plain text-format query: lsn and xid as text."""
        flat = [item for pair in options.items() for item in pair]
        rows = self.cluster.execute(
            f"SELECT lsn::text, xid::text, data FROM {function}(%s, %s::pg_lsn, %s,"
            f" VARIADIC %s::text[])",
            (slot, None if upto is None else str(upto), nchanges, flat),
            dbname=DB,
        )
        return [(LSN(lsn), int(xid), data) for lsn, xid, data in rows]

    def confirmed(self, slot: str) -> str:
        rows = self.cluster.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        )
        return str(rows[0][0])


@pytest.fixture(scope="module")
def fetch(publisher: PgCluster) -> Iterator[Fetch]:
    publisher.create_database(DB)
    ex = publisher.execute
    ex("CREATE TABLE t (id bigint PRIMARY KEY, label text, blob bytea)", dbname=DB)
    ex('CREATE PUBLICATION "' + PUBLICATION.replace('"', '""') + '" FOR TABLE t', dbname=DB)
    ex("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,), dbname=DB)
    ex("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (SLOT_TD,), dbname=DB)
    for statement in (
        "INSERT INTO t SELECT g, 'row ' || g, '\\x00ff'::bytea FROM generate_series(1, 50) g",
        "UPDATE t SET label = label || E' \\u00e9\\t''\"' WHERE id <= 10",
        "DELETE FROM t WHERE id > 45",
        "INSERT INTO t VALUES (1000, NULL, NULL)",
    ):
        ex(statement, dbname=DB)
    small_end = LSN(ex("SELECT pg_current_wal_lsn()::text")[0][0])
    ex(
        "INSERT INTO t SELECT g, repeat('x', 20), NULL FROM generate_series(2000, %s) g",
        (2000 + BIG_ROWS - 1,),
        dbname=DB,
    )
    yield Fetch(publisher, small_end)
    for slot in (SLOT, SLOT_TD):
        ex("SELECT pg_drop_replication_slot(%s)", (slot,), dbname=DB)
    ex(f'DROP DATABASE "{DB}"')


@pytest.fixture(params=["chunked", "server_cursor"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both fetch paths: chunked rows (libpq 17+), and the server-side cursor before that."""
    if request.param == "chunked":
        if not slots_module._chunked_rows():
            pytest.skip("this psycopg/libpq has no chunked-rows mode")
    else:
        monkeypatch.setattr(slots_module, "_chunked_rows", lambda: False)
    return str(request.param)


def test_binary_rows_are_the_servers(fetch: Fetch, mode: str) -> None:
    before = fetch.confirmed(SLOT)
    rows = list(
        fetch.hook().peek_changes(
            SLOT, upto_lsn=fetch.small_end, options=fetch.options, batch_rows=7
        )
    )
    expected = fetch.reference(
        "pg_logical_slot_peek_binary_changes", SLOT, fetch.options, fetch.small_end, None
    )
    assert len(rows) > 70 and rows == expected
    for lsn, xid, data in rows:
        assert type(lsn) is LSN and type(xid) is int and type(data) is bytes
    first = rows[0][0]
    assert first == LSN(str(first)) and hash(first) == hash(LSN(int(first)))
    assert repr(first) == f"LSN('{first}')"
    assert fetch.confirmed(SLOT) == before  # a peek never consumes

    events = list(PgOutputStream(proto_version=1).decode(rows))
    changes = [e for e in events if isinstance(e, Change)]
    assert [c.op for c in changes].count("I") == 51 and len(changes) == 51 + 10 + 5
    assert sum(isinstance(e, TransactionCommit) for e in events) == 4
    updated = [c.new for c in changes if c.op == "U"]
    assert updated[0] == {"id": 1, "label": "row 1 \u00e9\t'\"", "blob": b"\x00\xff"}


def test_text_rows_are_the_servers(fetch: Fetch, mode: str) -> None:
    options = {"include-xids": "1", "skip-empty-xacts": "1"}
    rows = list(
        fetch.hook().peek_changes(
            SLOT_TD, upto_lsn=fetch.small_end, options=options, binary=False, batch_rows=5
        )
    )
    expected = fetch.reference(
        "pg_logical_slot_peek_changes", SLOT_TD, options, fetch.small_end, None
    )
    assert rows == expected and len(rows) > 70
    assert all(type(data) is str for _, _, data in rows)
    assert any("\u00e9" in str(data) for _, _, data in rows)


def test_upto_nchanges(fetch: Fetch, mode: str) -> None:
    rows = list(
        fetch.hook().peek_changes(SLOT, upto_lsn=None, options=fetch.options, upto_nchanges=3)
    )
    expected = fetch.reference("pg_logical_slot_peek_binary_changes", SLOT, fetch.options, None, 3)
    # upto_nchanges stops after the transaction in which the count is reached
    assert rows == expected and 3 < len(rows) < 100


@pytest.mark.parametrize(
    "name", ["Upper", "x'; DROP TABLE t; --", 'a"b', "", "a" * 64, "slot name", "ä"]
)
def test_invalid_slot_names_are_refused_before_any_query(fetch: Fetch, name: str) -> None:
    with pytest.raises(InvalidSlotNameError):
        next(iter(fetch.hook().peek_changes(name, upto_lsn=None, options=fetch.options)))


def test_missing_slot(fetch: Fetch, mode: str) -> None:
    with pytest.raises(SlotNotFoundError, match="no_such_slot"):
        list(fetch.hook().peek_changes("no_such_slot", upto_lsn=None, options=fetch.options))


def _sending(fetch: Fetch) -> list[tuple[Any, ...]]:
    return fetch.cluster.execute(
        "SELECT pid, state, wait_event FROM pg_stat_activity WHERE application_name = %s",
        (APP,),
    )


def test_rows_stream_and_an_early_stop_leaves_nothing_running(fetch: Fetch, mode: str) -> None:
    rows = fetch.hook().peek_changes(SLOT, upto_lsn=None, options=fetch.options, batch_rows=1000)
    assert isinstance(rows, Generator)
    first = next(rows)
    assert first[0] < fetch.small_end
    # The client holds one chunk of the window. Chunked rows: the server is blocked writing the
    # rest to the socket; server-side cursor: the rest waits in the open portal for a FETCH.
    waiting = (
        ("active", "ClientWrite") if mode == "chunked" else ("idle in transaction", "ClientRead")
    )
    wait_until(
        lambda: [r for r in _sending(fetch) if (r[1], r[2]) == waiting],
        what=f"the peek's backend waiting for the client {waiting}",
        timeout=30,
    )
    rows.close()
    wait_until(lambda: not _sending(fetch), what="the peek's session to end", timeout=30)
    # nothing consumed, nothing left holding the slot: a second peek reads it all
    count = sum(
        1
        for _ in fetch.hook().peek_changes(
            SLOT, upto_lsn=None, options=fetch.options, batch_rows=50_000
        )
    )
    assert count > BIG_ROWS


def test_server_timeouts_do_not_end_a_big_peek(fetch: Fetch, mode: str) -> None:
    """A role whose statements time out after 50 ms: the peek of the whole big transaction (a
    tuplestore filled server-side first) takes longer, and still completes, on both paths."""
    from airflow_pglogrepl.postgres.source import PgSource

    role = f"peek_short_{mode}"
    fetch.cluster.execute(
        f"DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN REPLICATION PASSWORD 'pw';"
        f" ALTER ROLE {role} SET statement_timeout = 50; ALTER ROLE {role} SET lock_timeout = 50"
    )
    dsn = make_dsn({**fetch.cluster.params(DB), "user": role, "password": "pw"})
    source = PgSource(dsn)
    assert source.session().execute("SHOW statement_timeout").fetchone() == {
        "statement_timeout": "50ms"
    }
    expected = len(
        fetch.reference("pg_logical_slot_peek_binary_changes", SLOT, fetch.options, None, None)
    )
    rows = sum(1 for _ in source.peek_changes(SLOT, upto_lsn=None, options=fetch.options))
    assert rows == expected > BIG_ROWS
    end = source.flush_lsn()
    arrow = sum(len(b) for b in source.peek_arrow(SLOT, upto_lsn=end, options=fetch.options))
    assert arrow == expected


def test_a_missing_publication_is_named_not_taken_for_a_missing_slot(
    fetch: Fetch, mode: str
) -> None:
    """Both are SQLSTATE 42704: the error says which object is missing."""
    from airflow_pglogrepl.exceptions import PublicationNotFoundError

    options = {"proto_version": "1", "publication_names": '"gone ""pub"""'}
    with pytest.raises(PublicationNotFoundError, match="publication 'gone \"pub\"' does not"):
        list(fetch.hook().peek_changes(SLOT, upto_lsn=fetch.small_end, options=options))
    # the Arrow path too (PostgreSQL 18 would decode past it with only a warning)
    with pytest.raises(PublicationNotFoundError, match="publication 'gone \"pub\"' does not"):
        list(fetch.hook().peek_arrow(SLOT, upto_lsn=fetch.small_end, options=options))
