"""Table parity: the comparison says by how much, and on live clusters names each difference."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from psycopg import sql

from airflow_pglogrepl.hooks.parity import TableChecksum
from airflow_pglogrepl.operators.parity import TableParityCheckOperator, compare
from airflow_pglogrepl.tables import TableRef
from tests.support.airflow import FakeTI, context
from tests.support.cutover import HOSTILE_TABLE_SQL, Pair

# -- parity ----------------------------------------------------------------------------------------


def test_parity_compare_says_by_how_much() -> None:
    t = TableRef("public", "orders")
    same = compare(t, TableChecksum(10, -5), TableChecksum(10, -5))
    assert same.problem is None and same.to_dict()["match"] is True
    fewer = compare(t, TableChecksum(10, 1), TableChecksum(9, 2))
    assert fewer.problem == "subscriber has 1 row fewer (9 vs 10 on the publisher)"
    assert fewer.to_dict()["row_difference"] == -1
    more = compare(t, TableChecksum(10, 1), TableChecksum(13, 2))
    assert more.problem is not None and more.problem.startswith("subscriber has 3 rows more")
    content = compare(t, TableChecksum(10, 2**62), TableChecksum(10, 2**62 + 1))
    assert content.problem is not None and "checksums differ" in content.problem
    assert content.to_dict()["publisher_checksum"] == str(2**62)  # exact in JSON
    assert compare(t, TableChecksum(1, 1), None).problem == "missing on the subscriber"


# The tests below depend on the server's major version: make test runs them on 15 to 18.


# -- parity --------------------------------------------------------------------------------------


@pytest.mark.pgversion
def test_parity_passes_on_equal_tables_and_names_each_difference(pair: Pair) -> None:
    pair.both("CREATE TABLE p_mixed (id int PRIMARY KEY, v text, at timestamptz, f float8,"
              " b bytea, j jsonb, n numeric)")  # fmt: skip
    pair.pub("CREATE TABLE p_order (id int PRIMARY KEY, a text, b int)")
    pair.sub("CREATE TABLE p_order (b int, extra text DEFAULT 'sub only', a text,"
             " id int PRIMARY KEY)")  # fmt: skip
    pair.both(f"CREATE TABLE {HOSTILE_TABLE_SQL} (id int, v text)")  # no key: duplicates count
    pair.pub("CREATE TABLE p_only_on_publisher (id int)")
    fill = {
        "p_mixed": "INSERT INTO p_mixed SELECT g, md5(g::text), timestamptz '2024-01-01 00:00Z'"
                   " + g * interval '1 hour', g / 3.0, decode(md5(g::text), 'hex'),"
                   " jsonb_build_object('k', g), g * 1.5 FROM generate_series(1, 2000) g",
        "p_order": "INSERT INTO p_order (id, a, b) SELECT g, 'a' || g, g"
                   " FROM generate_series(1, 500) g",
        "hostile": f"INSERT INTO {HOSTILE_TABLE_SQL} SELECT g % 10, 'dup'"
                   " FROM generate_series(1, 100) g",
    }  # fmt: skip
    for statement in fill.values():
        pair.both(statement)
    # Text output must not depend on the session: the subscriber's database uses another zone.
    pair.sub(sql.SQL("ALTER DATABASE {} SET timezone = 'Asia/Tokyo'").format(
        sql.Identifier(pair.sub_db)))  # fmt: skip

    def check(*tables: str) -> Any:
        return TableParityCheckOperator(
            task_id="parity", publisher_conn_id=pair.pub_conn, subscriber_conn_id=pair.sub_conn,
            tables=list(tables), parallelism=3,
        )  # fmt: skip

    tables = ["p_mixed", "p_order", f"public.{HOSTILE_TABLE_SQL}"]
    report = check(*tables).execute(context())
    assert report["passed"] and report["checked"] == 3
    assert {t["publisher_checksum"] == t["subscriber_checksum"] for t in report["tables"]} == {True}
    assert report["tables"][0]["publisher_rows"] == 2000

    pair.sub("UPDATE p_mixed SET v = 'planted' WHERE id = 5")
    pair.sub(f"DELETE FROM {HOSTILE_TABLE_SQL} WHERE ctid IN"
             f" (SELECT ctid FROM {HOSTILE_TABLE_SQL} LIMIT 1)")  # fmt: skip
    ti = FakeTI()
    with pytest.raises(AirflowFailException) as failure:
        check(*tables, "p_only_on_publisher").execute(context(ti))
    text = str(failure.value)
    assert "failed for 3 of 4 tables" in text
    assert "public.p_mixed: same row count (2000) but checksums differ" in text
    assert f"public.{HOSTILE_TABLE_SQL}: subscriber has 1 row fewer (99 vs 100" in text
    assert "public.p_only_on_publisher: missing on the subscriber" in text
    assert "p_order" not in text
    pushed = ti.pushed["return_value"]
    assert pushed["differing"] == ["public.p_mixed", f"public.{HOSTILE_TABLE_SQL}",
                                   "public.p_only_on_publisher"]  # fmt: skip
    assert pushed["tables"][2]["row_difference"] == -1
