"""What publications cover, read live: each relation as pgoutput sends it, its leaves, and the
transactions that created each and published it, as 64-bit ids (the drain judges from them
whether every row a relation held is in the WAL: ``pipeline.coverage``)."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.postgres.coverage import PublishedRelation, SourceCoverage, _full
from airflow_pglogrepl.postgres.source import PgSource
from tests.support.databases import Database


def covered(database: Database, *publications: str) -> SourceCoverage:
    return PgSource(database.cluster.dsn(database.name)).publication_coverage(list(publications))


def by_name(coverage: SourceCoverage) -> dict[str, PublishedRelation]:
    return {r.table.name: r for r in coverage.relations}


def published_then(relation: PublishedRelation) -> bool:
    return relation.published is None or relation.published <= relation.created


def test_a_table_listed_by_the_transaction_that_created_it_was_published_then(
    database: Database,
) -> None:
    before = covered(database).horizon
    database.sql("CREATE TABLE old (id int PRIMARY KEY); INSERT INTO old VALUES (1)")
    database.sql("CREATE PUBLICATION p FOR TABLE old")
    database.sql("CREATE TABLE fresh (id int PRIMARY KEY); ALTER PUBLICATION p ADD TABLE fresh")
    found = covered(database, "p")
    tables = by_name(found)
    assert not published_then(tables["old"]) and published_then(tables["fresh"])
    assert before <= tables["old"].created < tables["fresh"].created < found.horizon
    assert [leaf.table.name for leaf in tables["old"].leaves.values()] == ["old"]
    database.sql("ALTER PUBLICATION p DROP TABLE old; ALTER PUBLICATION p ADD TABLE old")
    assert by_name(covered(database, "p"))["old"].membership != tables["old"].membership


def test_partitions_created_under_their_root_were_linked_then_attached_ones_were_not(
    database: Database,
) -> None:
    database.sql("CREATE TABLE parted (id int, region text, PRIMARY KEY (id, region))"
                 " PARTITION BY LIST (region);"
                 "CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us')")  # fmt: skip
    database.sql("CREATE PUBLICATION viaroot FOR TABLE parted"
                 " WITH (publish_via_partition_root = true);"
                 "CREATE PUBLICATION leaves FOR TABLE parted")  # fmt: skip
    database.sql("CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu')")
    database.sql("CREATE TABLE parted_af (id int, region text, PRIMARY KEY (id, region))")
    database.sql("ALTER TABLE parted ATTACH PARTITION parted_af FOR VALUES IN ('af')")
    root = by_name(covered(database, "viaroot"))
    assert list(root) == ["parted"]
    assert {leaf.table.name: leaf.linked_then for leaf in root["parted"].leaves.values()} == {
        "parted_us": True, "parted_eu": True, "parted_af": False,
    }  # fmt: skip
    each = by_name(covered(database, "leaves"))  # without via root: each leaf on its own
    assert {name: r.linked_then and published_then(r) for name, r in each.items()} == {
        "parted_us": False, "parted_eu": True, "parted_af": False,
    }  # fmt: skip


def test_schemas_and_all_tables_publish_from_creation_and_altering_them_changes_nothing(
    database: Database,
) -> None:
    database.sql("CREATE SCHEMA s; CREATE TABLE s.early (id int PRIMARY KEY)")
    database.sql(
        "CREATE PUBLICATION ps FOR TABLES IN SCHEMA s; CREATE PUBLICATION pa FOR ALL TABLES"
    )
    database.sql("CREATE TABLE s.born (id int PRIMARY KEY)")
    database.sql("ALTER TABLE s.born OWNER TO CURRENT_USER; ALTER PUBLICATION pa OWNER TO"
                 " CURRENT_USER; ALTER TABLE s.born RENAME TO renamed")  # fmt: skip
    schema = by_name(covered(database, "ps"))
    assert not published_then(schema["early"]) and published_then(schema["renamed"])
    every = by_name(covered(database, "pa"))
    assert every["renamed"].published is None  # all tables: from each one's creation


def test_hostile_names_are_read_as_they_are(database: Database) -> None:
    database.sql('CREATE TABLE "We""ird.Tab le" (id int PRIMARY KEY)')
    database.sql('CREATE PUBLICATION "p; DROP" FOR TABLE "We""ird.Tab le"')
    assert list(by_name(covered(database, "p; DROP"))) == ['We"ird.Tab le']


@pytest.mark.unit
@pytest.mark.parametrize(
    ("raw", "now", "full"),
    [
        (100, 200, 100),
        (4_294_967_000, (1 << 32) + 500, 4_294_967_000),  # before the 32-bit counter wrapped
        (300, (5 << 32) + 400, (5 << 32) + 300),  # epochs later: the nearest before now
        (3_000_000_000, (1 << 32) + 10, 3_000_000_000),  # over 2^31 ago: not "in the future"
    ],
)
def test_a_32_bit_id_is_read_as_the_nearest_64_bit_one_before_now(
    raw: int, now: int, full: int
) -> None:
    """Before: ``age()`` is a signed 32-bit difference, and an id over 2^31 transactions old
    read as younger than every recent one."""
    assert _full(raw, now) == full


def test_a_table_moved_into_a_published_schema_or_made_logged_was_not_published_then(
    database: Database,
) -> None:
    """Before (a review found it): only the transaction that created a table was compared, so
    one filled elsewhere, then moved into a published schema or made logged, counted whole."""
    database.sql("CREATE SCHEMA s; CREATE PUBLICATION ps FOR TABLES IN SCHEMA s")
    database.sql("CREATE TABLE moved (id int PRIMARY KEY); INSERT INTO moved VALUES (1)")
    database.sql("ALTER TABLE moved SET SCHEMA s")
    database.sql("CREATE UNLOGGED TABLE s.unlogged (id int PRIMARY KEY)")
    database.sql("INSERT INTO s.unlogged VALUES (1); ALTER TABLE s.unlogged SET LOGGED")
    database.sql("CREATE TABLE s.born (id int PRIMARY KEY)")
    found = by_name(covered(database, "ps"))
    assert {name: r.linked_then for name, r in found.items()} == {
        "moved": False, "unlogged": False, "born": True,
    }  # fmt: skip


def test_rows_its_creator_wrote_before_it_was_published_make_a_table_not_born(
    database: Database,
) -> None:
    """``CREATE TABLE t; COPY t; ALTER TABLE root ATTACH PARTITION t`` in one transaction: the
    rows written before the ATTACH are decoded as ``t``'s own, unpublished then, so the WAL
    carries none of them as the root's. Before: the link made by the creating transaction
    took ``t`` for born, and its rows were silently missing from the lake."""
    src = PgSource(database.cluster.dsn(database.name))
    database.sql("CREATE TABLE r (id int, k int) PARTITION BY RANGE (k);"
                 "CREATE PUBLICATION pr FOR TABLE r WITH (publish_via_partition_root = true);"
                 "CREATE PUBLICATION pt FOR TABLE r")  # fmt: skip
    database.sql("CREATE TABLE r_filled (id int, k int); INSERT INTO r_filled VALUES (1, 5);"
                 "ALTER TABLE r ATTACH PARTITION r_filled FOR VALUES FROM (0) TO (10)")  # fmt: skip
    database.sql("CREATE TABLE r_born PARTITION OF r FOR VALUES FROM (10) TO (20);"
                 "INSERT INTO r VALUES (2, 15)")  # fmt: skip
    database.sql('CREATE TABLE "t ""x" (id int); INSERT INTO "t ""x" VALUES (1);'
                 'ALTER PUBLICATION pt ADD TABLE "t ""x"')  # fmt: skip
    database.sql("CREATE TABLE t_empty (id int); ALTER PUBLICATION pt ADD TABLE t_empty;"
                 "INSERT INTO t_empty VALUES (1)")  # fmt: skip
    for known in (None, set()):
        root = by_name(src.publication_coverage(["pr"], known=known))["r"]
        leaves = {leaf.table.name: leaf.linked_then for leaf in root.leaves.values()}
        tables = {n: r.linked_then for n, r in by_name(src.publication_coverage(
            ["pt"], known=known)).items()}  # fmt: skip
        if known is None:  # the catalog alone: every one of them made published at its creation
            assert leaves == {"r_filled": True, "r_born": True}
            assert tables['t "x'] and tables["t_empty"]
        else:
            assert leaves == {"r_filled": False, "r_born": True}
            assert not tables['t "x'] and tables["t_empty"]
            assert not tables["r_filled"] and tables["r_born"]  # (each leaf on its own)
    recorded = {root.oid, *root.leaves}
    assert (
        by_name(src.publication_coverage(["pr"], known=recorded))["r"]
        .leaves[next(o for o, leaf in root.leaves.items() if leaf.table.name == "r_filled")]
        .linked_then
    )  # a leaf the lake records is not read again
