"""A lake's Asset: one URI however the lake is spelled, an absolute ``file://`` URI for a local
path, and never a URI with credentials in it (it would be in every Asset event)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_pglogrepl.exceptions import LakeLocationError
from airflow_pglogrepl.operators.assets import lake_asset


def test_every_spelling_of_one_lake_is_one_asset() -> None:
    uris = {lake_asset(s).uri for s in ("s3://b1b/lake", "s3a://b1b/lake/", "s3n://b1b/lake")}
    assert uris == {"s3://b1b/lake"}


def test_a_local_lake_is_its_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert lake_asset("lake").uri == f"file://{tmp_path / 'lake'}"


def test_a_lake_with_credentials_is_no_asset() -> None:
    with pytest.raises(LakeLocationError, match="holds credentials") as caught:
        lake_asset("s3://AKID:SEKRET@bucket/lake")
    assert "SEKRET" not in str(caught.value)
