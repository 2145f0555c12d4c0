"""The lake's store: its secrets stay out of sight, every engine is handed the same store."""

from __future__ import annotations

import os
import stat

import pytest

from airflow_pglogrepl.hooks.object_store import LakeLocationError, check_sink, lake_store, store_of
from airflow_pglogrepl.lake import storage
from airflow_pglogrepl.lake.storage import ObjectStore

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
    ("sink", "named"),
    [
        ("s3://AKID:secret@bucket/lake", "holds credentials"),
        ("s3a://AKID@bucket/lake", "holds credentials"),
        ("gs://bucket/lake", "does not reach"),
        ("gs://key:secret@bucket/lake", "does not reach"),
        ("abfss://c@acct.dfs.core.windows.net/lake", "does not reach"),
    ],
)
def test_a_sink_with_credentials_or_an_unreachable_scheme_is_refused(sink: str, named: str) -> None:
    with pytest.raises(LakeLocationError, match=named) as caught:
        check_sink(sink)
    assert "secret" not in str(caught.value)


def test_a_store_named_for_a_local_lake_is_refused() -> None:
    with pytest.raises(LakeLocationError, match="is a local path"):
        lake_store("lake_store", "/tmp/lake")
    assert lake_store(None, "/tmp/lake") is None
    assert lake_store(None, "s3://b/lake") == ObjectStore()  # the engines' own defaults


def test_an_aws_connection_describes_the_store() -> None:
    assert store_of("AKID", "pw", None, {"region_name": "eu-west-1",
                    "endpoint_url": "http://minio:9000"}) == ObjectStore(
        endpoint_url="http://minio:9000", region="eu-west-1", access_key_id="AKID",
        secret_access_key="pw",
    )  # fmt: skip
    from_extra = store_of(
        None,
        None,
        "minio.internal:9000",
        {"aws_access_key_id": "A", "aws_secret_access_key": "S", "aws_session_token": "T"},
    )
    assert from_extra == ObjectStore(
        endpoint_url="https://minio.internal:9000",
        access_key_id="A",
        secret_access_key="S",
        session_token="T",
    )
    nested = store_of(None, None, None, {"service_config": {"s3": {"endpoint_url": "http://x"}}})
    assert nested.endpoint_url == "http://x"
