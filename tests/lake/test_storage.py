"""The lake's store: its secrets stay out of sight, every engine is handed the same store (the
store an Airflow connection describes, and the lake URIs refused: ``test_object_store.py``)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_pglogrepl.exceptions import LakeLocationError
from airflow_pglogrepl.lake import storage
from airflow_pglogrepl.lake.storage import ObjectStore
from tests.support.s3 import S3Server

STORE = ObjectStore(endpoint_url="http://127.0.0.1:9", region="eu-west-1",
                    access_key_id="AKIDEXAMPLE", secret_access_key="s3cr3t/+=",
                    session_token="t0ken")  # fmt: skip


def test_a_store_never_shows_its_secret_or_token() -> None:
    assert "s3cr3t" not in repr(STORE) and "t0ken" not in repr(STORE)
    assert "AKIDEXAMPLE" not in repr(STORE)
    assert STORE.secrets() == ["s3cr3t/+=", "t0ken"]


def test_spark_gets_a_private_profile_file_and_no_secret_in_its_configuration() -> None:
    with storage.using(STORE):
        settings = storage.spark_settings()
    assert not any("s3cr3t" in v or "t0ken" in v for v in settings.values()), settings
    assert settings["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert settings["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9"
    assert settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    profile = settings["spark.hadoop.fs.s3a.auth.profile.file"]
    assert stat.S_IMODE(os.stat(profile).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(profile)).st_mode) == 0o700
    with open(profile, encoding="utf-8") as file:
        text = file.read()
    assert "aws_secret_access_key = s3cr3t/+=" in text and "aws_session_token = t0ken" in text


def test_without_keys_spark_finds_its_own_and_no_file_is_written() -> None:
    with storage.using(ObjectStore(region="eu-west-1")):
        settings = storage.spark_settings()
    assert "spark.hadoop.fs.s3a.aws.credentials.provider" not in settings
    assert "spark.hadoop.fs.s3a.endpoint" not in settings  # AWS itself: S3A's default endpoint


def test_delta_rs_gets_every_key_and_a_local_lake_none() -> None:
    with storage.using(STORE):
        assert storage.delta_options("/tmp/lake/changes/public.t") is None
        options = storage.delta_options("s3a://b/lake/changes/public.t")
    assert options == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_REGION": "eu-west-1",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "s3cr3t/+=",
        "AWS_SESSION_TOKEN": "t0ken", "AWS_ALLOW_HTTP": "true",
    }  # fmt: skip
    assert ObjectStore.from_json(STORE.to_json()) == STORE


def test_every_s3_spelling_is_one_bucket_and_path_for_pyarrow() -> None:
    with storage.using(STORE):
        for uri in ("s3://b/lake/", "s3a://b/lake", "s3n://b/lake"):
            system, path = storage.filesystem(uri)
            assert type(system).__name__ == "S3FileSystem" and path == "b/lake", uri


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("secret_access_key", "x\ncredential_process = sh -c 'id > /tmp/pwned'"),
        ("access_key_id", "AKID\r"),
        ("session_token", "t\x00"),
        ("region", "eu-west-1\n"),
        ("region", "eu west"),
        ("endpoint_url", "http://minio:9000\n"),
        ("endpoint_url", "ftp://minio:9000"),
        ("endpoint_url", "http://min io:9000"),
        ("endpoint_url", "http://[::1]]]:9000"),
        ("secret_access_key", "a #comment"),
    ],
)
def test_a_store_value_an_engine_would_read_as_more_is_refused(field: str, value: str) -> None:
    """A newline in a key became lines of Spark's profile file, which the AWS SDK acts on (a
    ``credential_process`` ran as the worker's user); an endpoint with a blank crashed
    delta-rs' runtime. The error names the field, never the value."""
    with pytest.raises(ValueError, match=field) as caught:
        ObjectStore(**{field: value})
    assert value.strip() not in str(caught.value)


def test_an_endpoint_in_upper_case_is_still_plain_http() -> None:
    store = ObjectStore(endpoint_url="HTTP://127.0.0.1:9")
    assert store.delta_options()["AWS_ALLOW_HTTP"]
    store.arrow_filesystem()  # pyarrow took "HTTP" for no scheme it knows


@pytest.mark.parametrize(
    "store",
    [
        {"endpoint_url": "http://minio_1:9000"},  # a Docker Compose service name
        {"endpoint_url": "https://[2001:db8::1]:9000/minio"},
        {"endpoint_url": "https://s3.example.com"},
        {"region": "us-gov-west-1"},
        {"region": "cn-north-1"},
        {"region": "auto"},
        {"session_token": "IQoJb3JpZ2luX2VjE/+abc=="},
    ],
)
def test_real_world_stores_are_taken(store: dict[str, str]) -> None:
    ObjectStore(**store)


def test_keys_for_executors_on_other_machines_are_refused_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, s3_server: S3Server
) -> None:
    """The profile file is on the driver's machine only: executors elsewhere failed at their
    first write, after the changelog's windows were committed."""
    from airflow_pglogrepl.operators.drain import SlotDrainOperator

    monkeypatch.setenv("AIRFLOW_CONN_LAKE_KEYS", json.dumps(s3_server.connection()))
    lake_root = f"s3://{s3_server.new_bucket()}/lake"
    operator = SlotDrainOperator(task_id="d", postgres_conn_id="p", slot_name="s",
                                 publications=["p"], lake=lake_root,
                                 lake_conn_id="lake_keys")  # fmt: skip
    operator._master = "spark://10.0.0.1:7077"
    with pytest.raises(LakeLocationError, match="reach Spark's driver only"):
        operator._use_lake_store(lake_root)
    operator._master = "local[2]"
    try:
        operator._use_lake_store(lake_root)
        assert operator._store == s3_server.store == storage.current()
    finally:
        storage.use(None)


def test_a_jar_list_without_s3a_is_refused_for_an_object_store(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from airflow_pglogrepl.spark.session import delta_jars

    jar = tmp_path / "delta-spark_4.2_2.13-4.4.0.jar"
    jar.write_bytes(b"")
    monkeypatch.setenv("PGLOGREPL_DELTA_JARS", str(jar))
    assert delta_jars() == [str(jar)]
    with pytest.raises(FileNotFoundError, match="without hadoop-aws"):
        delta_jars(object_store=True)


def test_the_profile_file_is_removed_when_the_process_is_terminated(tmp_path: Path) -> None:
    """``on_kill`` sends SIGTERM: the process died at once and left the keys on disk."""
    code = (
        "import sys, time\n"
        "from airflow_pglogrepl.lake import storage\n"
        "storage.use(storage.ObjectStore(access_key_id='A', secret_access_key='S'))\n"
        "print(storage.spark_settings()['spark.hadoop.fs.s3a.auth.profile.file'], flush=True)\n"
        "time.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    profile = child.stdout.readline().strip()
    assert os.path.exists(profile)
    child.terminate()
    assert child.wait(timeout=60) == 143
    assert not os.path.exists(os.path.dirname(profile))
