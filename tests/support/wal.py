"""Placing WAL records where a test needs them: a commit record right after a page's header.

PostgreSQL writes WAL in 8 KiB pages, each opening with a 24-byte header (40 bytes on a
segment's first page). A record that ends exactly at a page's end is followed by one that starts
at page offset 24; a peek whose ``upto_lsn`` lies inside that header reads the second record too
(see ``airflow_pglogrepl.pipeline.drain.window_end``).
See https://www.postgresql.org/docs/15/wal-internals.html
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from airflow_pglogrepl.lsn import LSN
from tests.support.sources import Source

WAL_PAGE = 8192  # XLOG_BLCKSZ
PAGE_HEADER = 24  # SizeOfXLogShortPHD

# A transactional message: WAL of the open transaction that pgoutput (messages off) never sends.
# Its record is MAXALIGN(overhead + n) bytes; with n > 255 the data header keeps its long form,
# so the overhead is the same for every pad.
PAD = "SELECT pg_logical_emit_message(true, 'pad', repeat('x', %s::int))"
MEASURE = 300
# WAL the drain reads past and stores nothing of: a committed transaction of one such message.
FILLER = "SELECT pg_logical_emit_message(true, 'filler', repeat('x', %s::int))"
INSERT_LSN = "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint"


def commit_after_page_header(src: Source, statement: str, *, attempts: int = 10) -> LSN:
    """Run ``statement`` (which must write to a published table) in a transaction whose commit
    record starts at page offset 24, right after a page header; return its commit LSN.

    The transaction's WAL is padded until its last record ends exactly at a page's end: the
    insert position then reads as the next page's start plus its header (XLogBytePosToRecPtr).
    Another backend writing WAL between that check and the commit moves the commit elsewhere:
    the attempt commits anyway (its rows stay) and the next one tries on a later page.
    """
    for _ in range(attempts):
        with src.cluster.connect(src.db, autocommit=False) as conn, conn.cursor() as cur:
            cur.execute(statement)
            cur.execute("SELECT pg_current_xact_id()::text::bigint")
            xid = _one(cur)
            placed = _pad_to_page_end(cur)
            conn.commit()
        if placed:
            commit = _commit_lsn(src, xid)
            if int(commit) % WAL_PAGE == PAGE_HEADER:
                return commit
    raise AssertionError(
        f"no commit record placed at page offset {PAGE_HEADER} in {attempts} tries"
    )


def _pad_to_page_end(cur: Any) -> bool:
    """Emit pads in the open transaction until the insert position is at page offset 24 (the
    last record ended at a page's end); False when other backends' WAL keeps getting between.

    ``size`` is what a pad of ``MEASURE`` bytes takes, learnt from the pads already written
    (within one page, so no page header is counted in); a pad of ``MEASURE + room - size``
    bytes then takes exactly the ``room`` left on the page, both being multiples of 8.
    """
    size = 0
    for _ in range(20):
        here = _insert_lsn(cur)
        if here % WAL_PAGE == PAGE_HEADER:
            return True
        room = WAL_PAGE - here % WAL_PAGE
        # until measured, or when the page's rest is too small for any pad: a pad that measures
        # (and, if it crosses, goes on to the next page)
        n = MEASURE if size == 0 or room < size else MEASURE + room - size
        cur.execute(PAD, (n,))
        after = _insert_lsn(cur)
        if after // WAL_PAGE == here // WAL_PAGE:
            size = after - here - (n - MEASURE)
    return False


def _insert_lsn(cur: Any) -> int:
    cur.execute(INSERT_LSN)
    return _one(cur)


def _one(cur: Any) -> int:
    row = cur.fetchone()
    assert row is not None
    return int(row[0])


def _commit_lsn(src: Source, xid: int) -> LSN:
    """The commit LSN of transaction ``xid`` as the slot decodes it (its Commit message)."""
    rows = src.sql(
        "SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version',"
        " '1', 'publication_names', %s) WHERE xid = %s::text::xid AND get_byte(data, 0) = 67",
        (src.slot, src.publication, xid),
    )
    assert len(rows) == 1, f"transaction {xid}: {len(rows)} Commit messages"
    return LSN(int.from_bytes(bytes(rows[0][0])[2:10], "big"))


@contextlib.contextmanager
def restart_lsn_pinned(src: Source, *, behind: int) -> Iterator[None]:
    """For the block, a transaction left open ``behind`` bytes of WAL before the slot's position,
    as a forgotten session leaves one: the slot is advanced past that WAL, and its
    ``restart_lsn`` stays at the open transaction's first record. Rolled back at the end. (A
    logical slot created meanwhile waits for that transaction to end.)"""
    with src.cluster.connect(src.db, autocommit=False) as conn:
        conn.execute(PAD, (1,))  # the open transaction's first record: decoding restarts here
        src.sql(FILLER, (behind,))
        src.sql("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (src.slot,))
        try:
            yield
        finally:
            conn.rollback()
