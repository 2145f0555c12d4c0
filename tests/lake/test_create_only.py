"""Log entries the lake writes itself on an object store are create-only: a writer that stalls
after choosing a version never overwrites the entry another writer committed meanwhile.

Each path that writes a log entry without delta-rs (a new column-mapped table, a first state,
a mapped schema change, a rename, a snapshot's publish) races a second writer on the S3 server:
the first writer's PUT is held by a proxy (``tests.support.s3_gate``) until the second has
committed the same version, then let go. The second writer's commit must stand, whole.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa
import pytest

from airflow_pglogrepl.exceptions import (
    LakeCommitConflictError,
    LakeLocationError,
    LakeStoreUnreachableError,
    SnapshotTableExistsError,
)
from airflow_pglogrepl.lake import (
    create_only,
    delta,
    durability,
    mapping,
    schema_commits,
    staging,
    storage,
)
from airflow_pglogrepl.lake.mapping import MappedSchema, mapped_of, mapped_schema, to_physical
from airflow_pglogrepl.lsn import LSN
from tests.support.s3 import S3Server
from tests.support.s3_gate import Answer, HeldWrite, s3_error

APP = "airflow-pglogrepl/race"


@pytest.fixture
def table_uri(s3_server: S3Server) -> Iterator[str]:
    with storage.using(s3_server.store):
        yield f"s3://{s3_server.new_bucket()}/lake/state/public.t"


def _rows(ids: list[int], name: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([name] * len(ids))})


def _race(server: S3Server, version: int, first: Callable[[], object],
          second: Callable[[], object]) -> BaseException | None:  # fmt: skip
    """``first`` runs with its write of log ``version`` held in flight; ``second`` commits
    meanwhile, straight to the server; then ``first``'s write goes on. Returns ``first``'s
    error (None: it returned)."""
    gate = HeldWrite(server.store, rf"/_delta_log/{version:020d}\.json$")
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            first()
        except BaseException as exc:
            outcome.append(exc)

    before = storage.current()
    storage.use(gate.store)
    writer = threading.Thread(target=run)
    try:
        writer.start()
        assert gate.held.wait(60) or outcome, "the first writer never wrote the log entry"
        assert not outcome, outcome
        storage.use(server.store)
        second()
    finally:
        gate.release()
        writer.join(60)
        gate.close()
        storage.use(before)
    assert not writer.is_alive()
    return outcome[0] if outcome else None


def _entry(uri: str, version: int) -> list[dict[str, object]]:
    system, base = storage.filesystem(uri)
    with system.open_input_stream(f"{base}/_delta_log/{version:020d}.json") as stream:
        return [json.loads(line) for line in stream.read().decode().splitlines()]


def _added(uri: str, version: int) -> list[str]:
    return sorted(str(a["add"]["path"]) for a in _entry(uri, version) if "add" in a)  # type: ignore[index]


def _ids(uri: str) -> list[int]:
    return sorted(delta.read_table(uri).column("id").to_pylist())


def _mapped_file(uri: str, rows: pa.Table, mapped: MappedSchema, prefix: str) -> delta.DataFile:
    return delta.write_file(uri, to_physical(rows, mapped), prefix)


@pytest.mark.parametrize("mapped", [True, False], ids=["new-mapped-table", "first-state"])
def test_a_table_created_by_two_writers_is_the_one_that_committed_first(
    s3_server: S3Server, table_uri: str, mapped: bool
) -> None:
    def create(ids: list[int], prefix: str) -> Callable[[], None]:
        rows = _rows(ids, prefix)
        schema_map = mapped_schema(rows.schema) if mapped else None
        file = (_mapped_file(table_uri, rows, schema_map, prefix) if schema_map is not None
                else delta.write_file(table_uri, rows, prefix))  # fmt: skip
        return lambda: delta.create_table(
            table_uri, rows.schema, [file], app=APP, version=1,
            configuration=delta.STATE_CONFIG, mapping=schema_map,
        )  # fmt: skip

    first, second = create([1, 2], "a"), create([3, 4, 5], "b")
    expected_files = None

    def second_commits() -> None:
        nonlocal expected_files
        second()
        expected_files = _added(table_uri, 0)

    error = _race(s3_server, 0, first, second_commits)
    assert isinstance(error, LakeCommitConflictError), error
    assert "another writer committed version 0" in str(error)
    assert _added(table_uri, 0) == expected_files  # the second writer's entry, untouched
    assert _ids(table_uri) == [3, 4, 5]


@pytest.mark.parametrize("change", ["add-column", "rename"])
def test_a_mapped_schema_change_never_overwrites_another_writers_commit(
    s3_server: S3Server, table_uri: str, change: str
) -> None:
    rows = _rows([1, 2], "v0")
    base = mapped_schema(rows.schema)
    delta.create_table(table_uri, rows.schema, [_mapped_file(table_uri, rows, base, "v0")],
                       app=APP, version=1, configuration=delta.KEEP_LOGS, mapping=base)  # fmt: skip

    def commit(ids: list[int], prefix: str) -> Callable[[], None]:
        table = delta.open_table(table_uri)
        assert table is not None
        current = mapped_of(table)
        assert current is not None
        if change == "rename":
            wanted = mapping.renamed(current, {"v": "w"})
            later = pa.table({"id": pa.array(ids, pa.int64()), "w": pa.array([prefix] * len(ids))})
        else:
            later = _rows(ids, prefix).append_column("extra", pa.array([prefix] * len(ids)))
            wanted = mapped_schema(later.schema, previous=current)
        file = _mapped_file(table_uri, later, wanted, prefix)
        return lambda: schema_commits.commit_with_schema(
            table_uri, wanted, [file], app=APP, version=2, expected=1
        )

    first, second = commit([10], "a"), commit([20, 21], "b")
    error = _race(s3_server, 1, first, second)
    assert isinstance(error, LakeCommitConflictError), error
    entry = _entry(table_uri, 1)
    assert next(a["add"]["path"] for a in entry if "add" in a).startswith("b")  # type: ignore[index]
    assert delta.txn_version(table_uri, APP) == 2
    assert _ids(table_uri) == [1, 2, 20, 21]


def test_a_snapshot_published_twice_at_once_keeps_the_first_copy_whole(
    s3_server: S3Server, table_uri: str
) -> None:
    from deltalake import CommitProperties, Transaction, write_deltalake

    def staged(point: str, ids: list[int]) -> str:
        uri = staging.staged_uri(table_uri, LSN(point))
        commit = CommitProperties(app_transactions=[Transaction(APP, int(LSN(point)))])
        write_deltalake(uri, _rows(ids, point), commit_properties=commit,
                        storage_options=storage.delta_options(uri))  # fmt: skip
        return uri

    first, second = staged("0/3000000", [1, 2]), staged("0/4000000", [7, 8, 9])
    error = _race(s3_server, 0, lambda: staging.publish(table_uri, first),
                  lambda: staging.publish(table_uri, second))  # fmt: skip
    assert isinstance(error, SnapshotTableExistsError), error
    assert not error.retryable  # a retry would copy the table again and meet the same table
    assert all(p.startswith("snapshot-0000000004000000/") for p in _added(table_uri, 0))
    assert _ids(table_uri) == [7, 8, 9]


def test_a_store_that_ignores_conditional_writes_is_refused_as_a_lake(
    s3_server: S3Server,
) -> None:
    """A store that lets a second create overwrite the first cannot keep two writers apart:
    refused before anything of the lake is written, naming what it needs."""
    careless = HeldWrite(s3_server.store, strip_conditions=True)
    bucket = s3_server.new_bucket()
    try:
        with storage.using(careless.store), pytest.raises(LakeLocationError) as refused:
            durability.put_commit(f"s3://{bucket}/lake/t", 0, b"{}\n")
    finally:
        careless.close()
    assert "conditional writes" in str(refused.value) and "overwrite" in str(refused.value)
    assert careless.store.secret_access_key not in str(refused.value)  # type: ignore[operator]
    assert not [k for k in s3_server.keys(bucket) if "_delta_log" in k]


def test_a_create_answered_with_a_conflict_after_our_own_write_landed_is_ours(
    s3_server: S3Server,
) -> None:
    """A retried create whose first attempt landed meets its own entry: the same bytes are a
    success, other bytes a conflict."""
    uri = f"s3://{s3_server.new_bucket()}/lake/t/_delta_log/{0:020d}.json"
    with storage.using(s3_server.store):
        assert create_only.put_if_absent(uri, b"mine\n")
        assert create_only.put_if_absent(uri, b"mine\n")
        assert not create_only.put_if_absent(uri, b"theirs\n")
        assert not durability.put_commit(uri.rsplit("/_delta_log/", 1)[0], 0, b"theirs\n")


def _commit_through(server: S3Server, answer: Answer) -> tuple[str, BaseException | bool]:
    """A log entry put through a proxy that answers as ``answer`` says: what came of it."""
    gate = HeldWrite(server.store, answer=answer)
    uri = f"s3://{server.new_bucket()}/lake/state/public.t"
    try:
        with storage.using(gate.store):
            try:
                return uri, durability.put_commit(uri, 0, b'{"commitInfo":{}}\n')
            except Exception as exc:
                return uri, exc
    finally:
        gate.close()


def test_a_store_error_names_the_status_never_the_text_that_holds_a_token(
    s3_server: S3Server,
) -> None:
    """Review finding: S3 repeats an expired session token in its error document, and the store
    client's error text carried it whole into the task's failure."""
    token = "IQoJb3JpZ2luX2VjSECRETSESSIONTOKEN0123456789"
    expired = s3_error("ExpiredToken", "The provided token has expired.", **{"Token-0": token})

    def answer(method: str, path: str) -> tuple[int, bytes] | None:
        return (400, expired) if method == "PUT" and "_delta_log" in path else None

    _, outcome = _commit_through(s3_server, answer)
    assert isinstance(outcome, LakeLocationError), outcome
    assert token not in str(outcome) and "400 ExpiredToken" in str(outcome)
    assert outcome.__cause__ is None and outcome.__suppress_context__


def test_a_conflict_with_no_entry_behind_it_is_tried_again(s3_server: S3Server) -> None:
    """Review finding: S3 answers 409 ConditionalRequestConflict while another create of the key
    is in flight; the entry was then read back, missing, and the run failed with a bare
    FileNotFoundError. Now the create is tried again, and lands when the other did not."""
    conflicts = iter([True, True])

    def answer(method: str, path: str) -> tuple[int, bytes] | None:
        if method == "PUT" and "_delta_log" in path and next(conflicts, False):
            return 409, s3_error("ConditionalRequestConflict", "A conflicting operation")
        return None

    uri, outcome = _commit_through(s3_server, answer)
    assert outcome is True
    with storage.using(s3_server.store):
        assert _entry(uri, 0) == [{"commitInfo": {}}]


@pytest.mark.parametrize(
    ("status", "body", "error", "says"),
    [
        (404, s3_error("NoSuchBucket", "no"), LakeLocationError, "has no bucket"),
        (403, s3_error("AccessDenied", "no"), LakeLocationError, "403 AccessDenied"),
        (501, s3_error("NotImplemented", "no"), LakeLocationError, "cannot hold a lake"),
        (503, s3_error("SlowDown", "later"), LakeStoreUnreachableError, "503 SlowDown"),
    ],
    ids=["no-bucket", "denied", "no-conditional-writes", "unavailable"],
)
def test_a_store_that_refuses_the_probe_is_named_with_its_fix(
    s3_server: S3Server, status: int, body: bytes, error: type[Exception], says: str
) -> None:
    """The first request of a run: a misspelt bucket, keys the store refuses and a store without
    conditional writes are the location's fault (not retried); a store that fails may recover."""

    def answer(method: str, path: str) -> tuple[int, bytes] | None:
        return (status, body) if method == "PUT" else None

    _, outcome = _commit_through(s3_server, answer)
    assert isinstance(outcome, error), outcome
    assert says in str(outcome)
