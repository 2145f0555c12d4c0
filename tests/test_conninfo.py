"""Building libpq parameters from Airflow connection fields, and keeping secrets out of text."""

from __future__ import annotations

from airflow_pglogrepl import conninfo


def test_fields_and_libpq_extras_pass_airflow_extras_do_not() -> None:
    params = conninfo.libpq_params(
        host="db.example",
        port=6543,
        user="repl",
        password="s3cret",
        dbname="app",
        extra={"sslmode": "verify-full", "connect_timeout": 5, "cursor": "dictcursor",
               "iam": False, "keepalives": True},
    )  # fmt: skip
    assert params == {
        "host": "db.example",
        "port": "6543",
        "user": "repl",
        "password": "s3cret",
        "dbname": "app",
        "sslmode": "verify-full",
        "connect_timeout": "5",
        "keepalives": "1",
        "application_name": "airflow-pglogrepl",
    }


def test_explicit_fields_win_over_extras_and_application_name_is_kept() -> None:
    params = conninfo.libpq_params(
        host="h", port=None, user=None, password=None, dbname=None,
        extra={"host": "other", "application_name": "mine"},
    )  # fmt: skip
    assert params["host"] == "h"
    assert params["application_name"] == "mine"
    assert "port" not in params and "password" not in params


def test_make_dsn_quotes_values() -> None:
    dsn = conninfo.make_dsn({"host": "h", "password": "it's a \\ pass", "dbname": "my db"})
    assert dsn == "host='h' password='it\\'s a \\\\ pass' dbname='my db'"


def test_redact_removes_raw_and_quoted_secret() -> None:
    params = {"password": "it's", "sslpassword": "k3y", "user": "u"}
    dsn = conninfo.make_dsn(params)
    text = f"failed with {dsn} and raw it's and k3y"
    out = conninfo.redact(text, conninfo.secrets_of(params))
    assert "it's" not in out and "it\\'s" not in out and "k3y" not in out
    assert "user='u'" in out


def test_describe_has_no_password() -> None:
    text = conninfo.describe({"user": "u", "password": "p4ss", "host": "h", "port": "1"})
    assert text == "u@h:1/u"
