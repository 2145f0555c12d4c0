"""Lineage dataset names, as OpenLineage's naming spec has them."""

from __future__ import annotations

from airflow_pglogrepl.operators.lineage import lake_location, postgres_namespace


def test_a_lake_table_is_named_by_its_bucket_and_key_or_its_absolute_path() -> None:
    assert lake_location("s3a://b1b/lakes/o/state/public.t") == (
        "s3://b1b",
        "lakes/o/state/public.t",
    )
    changes = "lakes/o/changes/public.t"
    assert lake_location(f"s3://b1b/{changes}/") == ("s3://b1b", changes)
    assert lake_location("/data/lake/state/public.t") == ("file", "/data/lake/state/public.t")
    assert lake_location("file:///data/lake/state/x.t") == ("file", "/data/lake/state/x.t")


def test_a_servers_namespace_names_no_user_and_no_password() -> None:
    params = {"host": "db.internal", "port": "6432", "user": "u", "password": "pw"}
    assert postgres_namespace(params) == "postgres://db.internal:6432"
    assert postgres_namespace({}) == "postgres://localhost:5432"
    assert postgres_namespace({"host": "/var/run/postgresql"}) == "postgres://localhost:5432"
    assert postgres_namespace({"host": "a,b", "port": "5433,5434"}) == "postgres://a:5433"
    # a dbname may be a whole URI with its password: the database's name comes from the server
    # (hook.database_name), and a host never carries one
    assert postgres_namespace({"host": "postgresql://u:pw@x"}) == "postgres://localhost:5432"
