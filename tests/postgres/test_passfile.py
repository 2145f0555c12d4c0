"""The password kept off what travels to Spark executors: a passfile entry escaped as libpq
reads it, a private file that exists only while the parameters are in use, and a password a
passfile cannot hold refused with the fix."""

from __future__ import annotations

import stat
from pathlib import Path

import psycopg
import pytest

from airflow_pglogrepl.conninfo import make_dsn
from airflow_pglogrepl.postgres.passfile import passfile_line, travelling_params
from airflow_pglogrepl.testing.pgcluster import PgCluster


def test_a_passfile_line_matches_any_server_and_escapes_what_libpq_parses() -> None:
    assert passfile_line("pw") == "*:*:*:*:pw\n"
    assert passfile_line("a:b\\c") == "*:*:*:*:a\\:b\\\\c\n"


def test_without_a_password_the_parameters_travel_as_they_are() -> None:
    params = {"host": "h", "user": "u", "password": ""}
    with travelling_params(params) as travelling:
        assert travelling == {"host": "h", "user": "u"}
    with travelling_params({"host": "h"}) as travelling:
        assert travelling == {"host": "h"}


@pytest.mark.parametrize("password", ["line\nbreak", "carriage\rreturn"])
def test_a_password_with_a_line_break_is_refused_without_being_shown(password: str) -> None:
    refused = pytest.raises(ValueError, match=r"line break.*Fix: change the password")
    with refused as caught, travelling_params({"host": "h", "password": password}):
        pass
    assert password not in str(caught.value)


def test_the_file_is_removed_when_the_block_fails() -> None:
    with pytest.raises(RuntimeError), travelling_params({"password": "pw"}) as travelling:
        path = Path(travelling["passfile"])
        assert path.read_text(encoding="utf-8") == "*:*:*:*:pw\n"
        raise RuntimeError("the job failed")
    assert not path.parent.exists()


def test_the_passfile_is_private_and_libpq_reads_it(publisher: PgCluster) -> None:
    params = publisher.params()
    hard = {**params, "password": "p:a\\ss" + params["password"]}  # what libpq must unescape
    with travelling_params(hard) as travelling:
        path = Path(travelling["passfile"])
        assert "password" not in travelling
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert "p\\:a\\\\ss" in path.read_text()
    with travelling_params(params) as travelling, psycopg.connect(make_dsn(travelling)) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert not path.exists()
