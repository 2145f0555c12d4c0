"""The columnar decoder against the reference (per-message decoder + ChangelogBatch).

Random pgoutput streams (the test encoder, written from the protocol documentation) are cut
into random Arrow batches and fed to both. Either the output is identical, table by table and
value by value, or the columnar decoder declines (``ColumnarUnsupportedError``) and the drain
would decode that window with the reference. For streams with nothing unusual in them it must
not decline, so the fast path is what is tested.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_pglogrepl.changelog.columnar import ColumnarDecoder, ColumnarUnsupportedError
from airflow_pglogrepl.changelog.rows import ChangelogBatch
from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pgoutput import Change, PgOutputStream
from airflow_pglogrepl.pgoutput.messages import (
    UNCHANGED_TOAST,
    BeginMessage,
    CommitMessage,
    DeleteMessage,
    InsertMessage,
    PgOutputMessage,
    TruncateMessage,
    TypeMessage,
    UpdateMessage,
)
from airflow_pglogrepl.pgoutput.values import OID
from tests.support.pgoutput_encoder import encode, relation

pytestmark = pytest.mark.unit

OPTIONS = {"proto_version": "1", "publication_names": "p", "messages": "false"}
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
T0 = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)

# type OID, typmod, values the server could print for it (text forms)
NUMERIC_10_2 = (10 << 16 | 2) + 4
TYPES: dict[str, tuple[int, int, list[str]]] = {
    "int4": (OID.INT4, -1, ["0", "-2147483648", "2147483647", "42"]),
    "int8": (OID.INT8, -1, ["-9223372036854775808", "9223372036854775807", "7"]),
    "text": (OID.TEXT, -1, ["", "plain", "日本, \"x\"", "a\nb", "NULL"]),
    "bool": (OID.BOOL, -1, ["t", "f"]),
    "float8": (OID.FLOAT8, -1, ["0.1", "NaN", "Infinity", "-Infinity", "-1e-300", "1.5"]),
    "float4": (OID.FLOAT4, -1, ["1.1", "NaN", "-Infinity", "3.4028235e+38"]),
    "num": (OID.NUMERIC, NUMERIC_10_2, ["1.50", "-99999999.99", "0.00", "NaN"]),
    "numu": (OID.NUMERIC, -1, ["0." + "0" * 39 + "1", "NaN", "-Infinity", "123.4500"]),
    "date": (OID.DATE, -1, ["2024-02-29", "infinity", "0044-03-15 BC", "10000-01-01"]),
    "ts": (OID.TIMESTAMP, -1, ["2024-01-01 10:00:00.123456", "-infinity",
                               "1999-12-31 23:59:59"]),
    "tstz": (OID.TIMESTAMPTZ, -1, ["2024-06-01 08:00:00+00", "2024-06-01 08:00:00.5+00",
                                   "infinity", "0001-01-01 00:00:00+00 BC"]),
    "time": (OID.TIME, -1, ["12:34:56.789", "24:00:00", "00:00:00"]),
    "jsonb": (OID.JSONB, -1, ['{"a": 1}', "[]", "null"]),
    "uuid": (OID.UUID, -1, ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    "iv": (OID.INTERVAL, -1, ["1 year 2 mons -3 days +04:05:06.789", "00:00:00"]),
    "inet": (OID.INET, -1, ["10.0.0.1", "192.168.1.5/24", "::1"]),
    "int4[]": (1007, -1, ["{1,NULL,3}", "{}", "{{1,2},{3,4}}"]),
    "point": (600, -1, ["(1,2)"]),  # kept as text
}  # fmt: skip


def reference(messages: Sequence[bytes]) -> dict[Any, pa.Table]:
    """The drain's reference path: per-message decoding into ChangelogBatch tables."""
    stream = PgOutputStream.from_options(OPTIONS)
    batches: dict[int, ChangelogBatch] = {}
    order: list[ChangelogBatch] = []
    for event in stream.decode((LSN(16 + i), None, m) for i, m in enumerate(messages)):
        if event.__class__ is Change:
            batch = batches.get(id(event.table))
            if batch is None:
                batch = batches[id(event.table)] = ChangelogBatch(event.table)
                order.append(batch)
            batch.add(event, event.seq)
    out: dict[Any, list[pa.Table]] = {}
    for batch in order:
        out.setdefault(_key(batch.table), []).append(batch.to_arrow())
    return {key: pa.concat_tables(parts) for key, parts in out.items()}


def columnar(messages: Sequence[bytes], cuts: Sequence[int]) -> dict[Any, pa.Table]:
    decoder = ColumnarDecoder(OPTIONS)
    out: dict[Any, list[pa.Table]] = {}
    bounds = [0, *sorted(set(cuts)), len(messages)]
    for start, stop in itertools.pairwise(bounds):
        array = pa.array(messages[start:stop], pa.binary())
        for piece in decoder.feed(array):
            out.setdefault(_key(piece.table), []).append(piece.rows)
    return {key: pa.concat_tables(parts) for key, parts in out.items()}


def _key(table: Any) -> Any:
    return (table.schema, table.table, tuple((c.name, c.type_oid, c.type_modifier)
                                             for c in table.columns))  # fmt: skip


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same, a, b))
    return bool(a == b) and type(a) is type(b)


def _plain(data_type: pa.DataType) -> pa.DataType:
    """Dates and timestamps as the integers stored (Python cannot hold them all)."""
    if pa.types.is_date32(data_type):
        return pa.int32()
    if pa.types.is_timestamp(data_type):
        return pa.int64()
    if pa.types.is_list(data_type):
        return pa.list_(_plain(data_type.value_type))
    if pa.types.is_struct(data_type):
        return pa.struct([f.with_type(_plain(f.type)) for f in data_type])
    return data_type


def rows_of(table: pa.Table) -> list[dict[str, Any]]:
    schema = pa.schema([f.with_type(_plain(f.type)) for f in table.schema])
    return table.cast(schema).to_pylist()


def assert_identical(got: dict[Any, pa.Table], want: dict[Any, pa.Table]) -> None:
    assert got.keys() == want.keys()
    for key, table in want.items():
        mine = got[key]
        assert mine.schema.equals(table.schema, check_metadata=True), key
        assert same(rows_of(mine), rows_of(table)), key


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], list[int]]:
    """Transactions of Inserts, Updates (plain, key and full old tuples, unchanged TOAST),
    Deletes and Truncates over up to three tables, with Relation messages re-describing a
    table mid-stream; cut into Arrow batches anywhere, inside transactions too."""
    messages: list[PgOutputMessage] = []
    tables: dict[int, list[tuple[str, str]]] = {}
    identity = {}

    def describe(relid: int) -> None:
        kinds = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=5))
        columns = [("id", "int4"), *((f"c{i}", k) for i, k in enumerate(kinds))]
        tables[relid] = columns
        identity[relid] = draw(st.sampled_from("dfn"))
        spec = [(name, TYPES[k][0], name == "id", TYPES[k][1]) for name, k in columns]
        messages.append(relation(relid, f"t{relid}", spec, identity=identity[relid]))

    def row(relid: int, toast: bool = False) -> tuple[Any, ...]:
        values: list[Any] = []
        for name, kind in tables[relid]:
            if name == "id":
                values.append(str(draw(st.integers(0, 50))))
                continue
            choice = draw(st.integers(0, 9))
            if choice == 0:
                values.append(None)
            elif choice == 1 and toast:
                values.append(UNCHANGED_TOAST)
            else:
                values.append(draw(st.sampled_from(TYPES[kind][2])))
        return tuple(values)

    xid = 100
    lsn = 0x1000
    for relid in range(1, draw(st.integers(1, 3)) + 1):
        describe(relid)
    if draw(st.booleans()):  # a domain's Type message
        messages.append(TypeMessage(None, 50000, "pg_catalog", "int4"))
    for _ in range(draw(st.integers(1, 6))):
        xid += 1
        lsn += 0x100
        messages.append(BeginMessage(LSN(lsn), T0 + dt.timedelta(seconds=xid), xid))
        for _ in range(draw(st.integers(0, 12))):
            relid = draw(st.sampled_from(sorted(tables)))
            what = draw(st.sampled_from("IIIUUDTR"))
            if what == "I":
                messages.append(InsertMessage(None, relid, row(relid)))
            elif what == "U":
                old_kind = draw(st.sampled_from([None, "K", "O"]))
                old = None
                if old_kind == "K":
                    old = tuple(v if i == 0 else None for i, v in enumerate(row(relid)))
                elif old_kind == "O":
                    old = row(relid)
                messages.append(UpdateMessage(None, relid, old_kind, old, row(relid, toast=True)))
            elif what == "D":
                old_kind = draw(st.sampled_from(["K", "O"]))
                old = row(relid)
                if old_kind == "K":
                    old = tuple(v if i == 0 else None for i, v in enumerate(old))
                messages.append(DeleteMessage(None, relid, old_kind, old))
            elif what == "T":
                named = draw(st.lists(st.sampled_from(sorted(tables)), min_size=1, unique=True))
                messages.append(TruncateMessage(None, draw(st.integers(0, 3)), tuple(named)))
            else:
                describe(relid)
        messages.append(CommitMessage(0, LSN(lsn), LSN(lsn + 0x10), T0 + dt.timedelta(seconds=xid)))
    encoded = [encode(m) for m in messages]
    cuts = draw(st.lists(st.integers(1, max(1, len(encoded) - 1)), max_size=4))
    return encoded, cuts


@SETTINGS
@given(streams())
def test_columnar_equals_the_reference(stream: tuple[list[bytes], list[int]]) -> None:
    messages, cuts = stream
    want = reference(messages)
    got = columnar(messages, cuts)
    assert_identical(got, want)


@SETTINGS
@given(streams(), st.data())
def test_damage_is_declined_or_the_same(stream: tuple[list[bytes], list[int]], data: Any) -> None:
    """A damaged message: the columnar decoder declines (the reference then says what is
    wrong) or, when the damage still decodes, gives what the reference gives."""
    messages, cuts = stream
    index = data.draw(st.integers(0, len(messages) - 1))
    original = messages[index]
    cut = data.draw(st.integers(0, len(original)))
    damaged = [*messages[:index], original[:cut] + original[cut + 1 :], *messages[index + 1 :]]
    try:
        want = reference(damaged)
    except Exception:
        with pytest.raises(ColumnarUnsupportedError):
            columnar(damaged, cuts)
        return
    try:
        got = columnar(damaged, cuts)
    except ColumnarUnsupportedError:
        return
    assert_identical(got, want)


def test_an_open_transaction_carries_into_the_next_batch() -> None:
    spec = [("id", OID.INT4, True), ("v", OID.TEXT)]
    messages = [
        encode(relation(7, "t", spec)),
        encode(BeginMessage(LSN(0x500), T0, 9)),
        encode(InsertMessage(None, 7, ("1", "a"))),
        encode(InsertMessage(None, 7, ("2", "b"))),
        encode(CommitMessage(0, LSN(0x500), LSN(0x510), T0)),
    ]
    for cut in range(1, len(messages)):
        assert_identical(columnar(messages, [cut]), reference(messages))
    decoder = ColumnarDecoder(OPTIONS)
    decoder.feed(pa.array(messages, pa.binary()))
    assert decoder.transactions == 1 and decoder.commit_lsns == [0x500]
