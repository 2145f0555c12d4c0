"""Rows of streamed transactions kept in the lake until their Stream Commit: given their commit
LSN and time then, without what aborted sub-transactions did and with ``_seq`` closing the gap;
dropped on a Stream Abort; replaced by a first block sent again; never left behind."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from airflow_pglogrepl.changelog.columnar import ColumnarDecoder, InProgress
from airflow_pglogrepl.lake.in_progress import InProgressTransactions
from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput.messages import (
    InsertMessage,
    StreamAbortMessage,
    StreamCommitMessage,
    StreamStartMessage,
    StreamStopMessage,
)
from airflow_pglogrepl.pgoutput.transaction_blocks import StreamAbort, StreamCommit
from airflow_pglogrepl.pgoutput.values import OID
from tests.support.pgoutput_encoder import encode, relation

pytestmark = pytest.mark.unit

OPTIONS = {"proto_version": "2", "streaming": "on", "publication_names": "p"}
T0 = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)


def batch(*messages: object) -> pa.Array:
    return pa.array([encode(m) for m in messages], pa.large_binary())  # type: ignore[arg-type]


def ins(subxid: int, value: int) -> InsertMessage:
    return InsertMessage(subxid, 16384, (str(value).encode(),))  # type: ignore[arg-type]


def run(tmp_path: Path, *batches: pa.Array) -> tuple[list[dict[str, Any]], InProgressTransactions]:
    """Feed ``batches`` through the decoder and the store; the committed rows, in order."""
    decoder = ColumnarDecoder(OPTIONS)
    kept = InProgressTransactions(Lake(str(tmp_path / "lake"), "s"))
    rows: list[dict[str, Any]] = []
    for data in batches:
        for part in decoder.parts(data):
            if isinstance(part, InProgress):
                kept.add(part)
            elif isinstance(part, StreamAbort):
                kept.abort(part.xid, part.subxid)
            elif isinstance(part, StreamCommit):
                assert decoder.commit_lsns[-1] == part.commit_lsn
                for piece in kept.commit(part):
                    rows += piece.rows.to_pylist()
    return rows, kept


def opening(xid: int, *, first: bool = True) -> list[object]:
    return [StreamStartMessage(xid, first), relation(16384, "t", [("id", OID.INT4, True)],
                                                     xid=xid)]  # fmt: skip


def test_a_committed_transaction_gets_its_commit_without_its_aborted_sub_transactions(
    tmp_path: Path,
) -> None:
    """Sub-transaction 901 (and 902, nested in it: it follows 901's first change) rolls back
    between the transaction's two blocks; what comes after stays, numbered on."""
    rows, kept = run(
        tmp_path,
        batch(*opening(900), ins(900, 1), ins(901, 2), ins(902, 3), StreamStopMessage(),
              StreamAbortMessage(900, 901)),
        batch(StreamStartMessage(900, False), ins(900, 4), ins(903, 5), StreamStopMessage(),
              StreamCommitMessage(900, 0, LSN(0x500), LSN(0x508), T0)),
    )  # fmt: skip
    assert [(r["id"], r["_seq"], r["_xid"], r["_commit_lsn"]) for r in rows] == [
        (1, 0, 900, 0x500), (4, 1, 900, 0x500), (5, 2, 900, 0x500),
    ]  # fmt: skip
    assert {r["_commit_ts"] for r in rows} == {T0}
    assert (
        kept.rows == 0 and not (tmp_path / "lake" / "_pglogrepl" / "in_progress" / "900").exists()
    )


def test_an_aborted_transaction_leaves_nothing_and_a_first_block_sent_again_replaces(
    tmp_path: Path,
) -> None:
    rows, kept = run(
        tmp_path,
        batch(*opening(700), ins(700, 1), StreamStopMessage(), StreamAbortMessage(700, 700)),
        batch(*opening(800), ins(800, 2), StreamStopMessage()),
        # a new stream sends 800 again from its start
        batch(*opening(800), ins(800, 2), ins(800, 3), StreamStopMessage(),
              StreamCommitMessage(800, 0, LSN(0x900), LSN(0x908), T0)),
    )  # fmt: skip
    assert [(r["id"], r["_seq"]) for r in rows] == [(2, 0), (3, 1)]
    assert kept.rows == 0


def test_clear_removes_what_an_earlier_run_left(tmp_path: Path) -> None:
    _, kept = run(tmp_path, batch(*opening(600), ins(600, 1), StreamStopMessage()))
    assert kept.rows == 1
    left = tmp_path / "lake" / "_pglogrepl" / "in_progress"
    assert any(left.rglob("*.arrow"))
    fresh = InProgressTransactions(Lake(str(tmp_path / "lake"), "s"))
    fresh.clear()
    assert not left.exists()


# -- frames a walsender sent (tests/support/recorded_frames.py --streaming; PostgreSQL 15) ----

RECORDED = Path(__file__).parents[1] / "postgres" / "recorded" / "pgoutput_v2_streamed.frames"


def test_recorded_streamed_transactions_give_the_changes_the_per_message_decoder_gives(
    tmp_path: Path,
) -> None:
    """Recorded with a 64 kB ``logical_decoding_work_mem``: a transaction of 1,500 inserts
    (300 of them rolled back to a savepoint) and 3 updates, sent in blocks with a small
    transaction committing in its middle; another of 1,000 inserts sent in blocks, then rolled
    back; a small one after. The columnar decoder and the lake give, row for row, what the
    per-message decoder (which holds streamed transactions in memory) gives."""
    from airflow_pglogrepl.pgoutput import Change, PgOutputStream
    from airflow_pglogrepl.postgres.stream_frames import frames
    from tests.support.recorded_frames import STREAMING, load

    messages = frames(load(RECORDED)).messages
    kinds = {m[:1] for m in messages.to_pylist()}
    assert {b"S", b"E", b"c", b"A"} <= kinds, "the recording holds no streamed transaction"
    decoder = ColumnarDecoder(STREAMING)
    kept = InProgressTransactions(Lake(str(tmp_path / "lake"), "s"))
    rows: list[dict[str, Any]] = []
    for part in decoder.parts(messages):
        if isinstance(part, InProgress):
            kept.add(part)
        elif isinstance(part, StreamAbort):
            kept.abort(part.xid, part.subxid)
        elif isinstance(part, StreamCommit):
            for piece in kept.commit(part):
                rows += piece.rows.to_pylist()
        else:
            rows += [r for piece in part for r in piece.rows.to_pylist()]
    columnar = sorted((r["_commit_lsn"], r["_seq"], r["_op"], r["id"], r["v"]) for r in rows)
    events = PgOutputStream.from_options(STREAMING).decode(
        (LSN(0), None, m) for m in messages.to_pylist()
    )
    reference = sorted(
        (int(c.transaction.commit_lsn or 0), c.seq, c.op, c.new["id"], c.new["v"])
        for c in events if isinstance(c, Change)
    )  # fmt: skip
    assert columnar == reference
    inserted = sorted(r[3] for r in columnar if r[2] == "I")
    assert inserted == [*range(1, 601), *range(901, 1501), 10001, 10002]
    assert sorted((r[3], r[4]) for r in columnar if r[2] == "U") == [(1, "d"), (2, "d"), (3, "d")]
    assert kept.rows == 0


def test_a_table_described_inside_a_block_is_that_transactions_until_its_commit(
    tmp_path: Path,
) -> None:
    """Transaction 900 describes ``t`` with a column more (its own ALTER TABLE) inside a block:
    a whole transaction committing before it still reads ``t`` as before; after 900's commit
    everyone reads 900's description. Had 900 rolled back, its description would be gone."""
    from airflow_pglogrepl.pgoutput.messages import BeginMessage, CommitMessage

    wide = relation(16384, "t", [("id", OID.INT4, True), ("extra", OID.INT4)], xid=900)
    row = InsertMessage(None, 16384, (b"8", b"9"))  # type: ignore[arg-type]
    decoder = ColumnarDecoder(OPTIONS)
    kept = InProgressTransactions(Lake(str(tmp_path / "lake"), "s"))
    seen: list[tuple[list[str], dict[str, Any]]] = []

    def feed(data: pa.Array) -> None:
        for part in decoder.parts(data):
            if isinstance(part, InProgress):
                kept.add(part)
            elif isinstance(part, StreamCommit):
                seen.extend((p.rows.column_names, r) for p in kept.commit(part)
                            for r in p.rows.to_pylist())  # fmt: skip
            elif isinstance(part, list):
                seen.extend((p.rows.column_names, r) for p in part for r in p.rows.to_pylist())

    feed(batch(relation(16384, "t", [("id", OID.INT4, True)]),
               StreamStartMessage(900, True), wide,
               InsertMessage(900, 16384, (b"1", b"5")),  # type: ignore[arg-type]
               StreamStopMessage(),
               BeginMessage(LSN(0x100), T0, 7), InsertMessage(None, 16384, (b"7",)),  # type: ignore[arg-type]
               CommitMessage(0, LSN(0x100),
                                                                       LSN(0x108), T0),
               StreamCommitMessage(900, 0, LSN(0x200), LSN(0x208), T0),
               BeginMessage(LSN(0x300), T0, 8), row,
               CommitMessage(0, LSN(0x300), LSN(0x308), T0)))  # fmt: skip
    got = [("extra" in names, r["id"], r.get("extra")) for names, r in seen]
    assert got == [(False, 7, None), (True, 1, 5), (True, 8, 9)]


def test_a_store_that_refuses_to_delete_is_logged_not_raised_and_what_is_dropped_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``clear`` runs in a ``finally``: its failure must not replace the run's own error (or
    stop a hand-over to the peek). A transaction still in progress when a run ends is named,
    with the rows it dropped: the next run receives them again."""
    _, kept = run(tmp_path, batch(*opening(600), ins(600, 1), ins(600, 2), StreamStopMessage()))
    kept.report()
    assert "transaction 600 had not committed at this run's end" in caplog.text
    assert "2 of its rows" in caplog.text
    # a stream that ended early may have lost the commit with it: nothing is claimed, no warning
    caplog.clear()
    caplog.set_level(logging.INFO, logger="airflow_pglogrepl")
    kept.report(cut_short=True)
    (said,) = caplog.records
    assert said.levelno == logging.INFO and "before the stream ended" in said.getMessage()
    assert "still in progress" not in caplog.text and "had not committed" not in caplog.text

    def refuse(path: str) -> None:
        raise PermissionError("AccessDenied (simulated)")

    from types import SimpleNamespace

    kept._system = SimpleNamespace(delete_dir=refuse)
    kept.clear()
    assert "could not be removed" in caplog.text and "AccessDenied" in caplog.text
