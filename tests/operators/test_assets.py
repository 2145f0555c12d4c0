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


def test_a_lake_tables_asset_names_the_lake_the_kind_and_the_table(tmp_path: Path) -> None:
    from airflow_pglogrepl.operators.assets import lake_table_asset

    lake = str(tmp_path / "lake")
    assert lake_table_asset(lake, "public.orders").uri == (
        f"pglogrepl+file:{tmp_path}/lake/state/public.orders"  # (Airflow writes no empty host)
    )
    assert lake_table_asset("s3a://b1b/lake/", "public.orders", "history").uri == (
        "pglogrepl+s3://b1b/lake/history/public.orders"
    )
    # a name of any characters is one path segment of the URI, the same however it is given
    from airflow_pglogrepl.tables import TableRef

    odd = lake_table_asset(lake, TableRef("Sch; ema", 'Tab "le" é/x'), "changes")
    assert odd.uri.count("/") == lake_table_asset(lake, "public.t", "changes").uri.count("/")
    with pytest.raises(ValueError, match="kind is one of"):
        lake_table_asset(lake, "public.t", "states")


def test_the_uri_handler_takes_a_lake_table_and_refuses_anything_else() -> None:
    from urllib.parse import urlsplit

    from airflow_pglogrepl.operators.assets import sanitize_uri

    good = urlsplit("pglogrepl+s3://b1b/lake/state/public.t")
    assert sanitize_uri(good) == good
    for bad in ("pglogrepl+file:///lake/public.t", "pglogrepl+file:///lake/rows/public.t",
                "pglogrepl+s3:///lake/state/public.t"):  # fmt: skip
        with pytest.raises(ValueError, match="lake"):
            sanitize_uri(urlsplit(bad))


def test_an_asset_maps_to_the_dataset_the_drains_lineage_names(tmp_path: Path) -> None:
    from airflow_pglogrepl.operators.assets import convert_asset_to_openlineage, lake_table_asset
    from airflow_pglogrepl.operators.lineage import lake_location

    for lake, kind in ((str(tmp_path / "lake"), "state"), ("s3://b1b/lake", "history")):
        dataset = convert_asset_to_openlineage(lake_table_asset(lake, "public.t", kind), None)
        assert (dataset.namespace, dataset.name) == lake_location(f"{lake}/{kind}/public.t")


def test_the_events_of_a_run_are_exactly_the_tables_it_changed(tmp_path: Path) -> None:
    from airflow_pglogrepl.operators.assets import lake_table_asset, table_events

    lake = str(tmp_path / "lake")
    result = {
        "slot": "s",
        "confirmed_flush_lsn_after": "0/100",
        "tables": {"public.a": 3, '"odd ""x"""."t"': 1},  # drained changes of these
        "materialized": {"public.a": "0/100", "public.idle": "0/100"},  # (a position moved)
        "history": {"public.a": "0/100", "public.idle": "0/100"},
        "backfills": {"public.b": {"built": True}, "public.c": {"built": False}},
        "table_versions": {"changes/public.a": 4, "state/public.a": 7, "state/public.b": 2},
    }
    events = {asset.uri: extra for asset, extra in table_events(result, lake)}
    assert set(events) == {lake_table_asset(lake, t, k).uri for t, k in [
        ("public.a", "changes"), ("public.a", "state"), ("public.a", "history"),
        ('"odd ""x"""."t"', "changes"), ("public.b", "state")]}  # fmt: skip
    assert events[lake_table_asset(lake, "public.a", "state").uri] == {
        "table": "public.a", "kind": "state", "lsn": "0/100", "changes": 3, "delta_version": 7,
        "slot": "s"}  # fmt: skip
    assert table_events({"slot": "s", "tables": {}}, lake) == []  # an idle run: none


def test_a_snapshot_changes_the_state_of_each_table_it_copied(tmp_path: Path) -> None:
    from airflow_pglogrepl.operators.assets import lake_table_asset, snapshot_events

    lake = str(tmp_path / "lake")
    result = {"slot": "s", "consistent_point": "0/50", "committed": True,
              "tables": {"public.a": {"rows": 5}, "public.b": {"rows": 0}}}  # fmt: skip
    events = {asset.uri: extra for asset, extra in snapshot_events(result, lake)}
    assert events == {lake_table_asset(lake, t).uri: {"table": t, "kind": "state", "lsn": "0/50",
                                                      "rows": n, "slot": "s"}
                      for t, n in (("public.a", 5), ("public.b", 0))}  # fmt: skip
    assert snapshot_events({**result, "committed": False}, lake) == []
