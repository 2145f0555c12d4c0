"""A partitioned root published through its root, whose partitions are created, attached and
detached between drains: what the re-snapshot and the online backfill must both leave equal to
the source (an attached table's rows and a detached one's come in no change)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_pglogrepl.tables import TableRef
from tests.support.drain import assert_state_equals_source
from tests.support.sources import Source

ROOT = TableRef("public", "parted")


def attach_and_detach_under_the_root(
    source: Source, lake_root: str, drain: Callable[[], dict[str, Any]]
) -> list[dict[str, Any]]:
    """The results of the drains after the attach and after the detach, each checked to leave
    no table incomplete and the root's state equal to the source."""
    source.sql("CREATE TABLE parted (id int, region text, v text, PRIMARY KEY (id, region))"
               " PARTITION BY LIST (region)")  # fmt: skip
    source.sql("CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us')")
    source.sql(f"CREATE PUBLICATION {source.publication} FOR TABLE parted"
               " WITH (publish_via_partition_root = true)")  # fmt: skip
    source.sql("INSERT INTO parted SELECT g, 'us', 'x' FROM generate_series(1, 225) g")
    drain()
    source.sql("CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu')")  # created
    source.sql("INSERT INTO parted SELECT g, 'eu', 'x' FROM generate_series(1, 30) g")
    source.sql("CREATE TABLE parted_af (id int, region text, v text, PRIMARY KEY (id, region))")
    source.sql("INSERT INTO parted_af SELECT g, 'af', 'x' FROM generate_series(1, 50) g")
    source.sql("ALTER TABLE parted ATTACH PARTITION parted_af FOR VALUES IN ('af')")
    source.sql("UPDATE parted SET v = 'y' WHERE region = 'af' AND id <= 10")
    attached = drain()
    assert attached["incomplete"] == {}
    assert_state_equals_source(source, lake_root, ROOT)  # the 50 rows are there
    source.sql("ALTER TABLE parted DETACH PARTITION parted_us")
    detached = drain()
    assert detached["incomplete"] == {}
    assert_state_equals_source(source, lake_root, ROOT)  # the 225 rows are gone
    return [attached, detached]
