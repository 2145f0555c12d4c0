"""What a set of publications covers now: each relation pgoutput sends changes as (a table, a
leaf, or a partitioned root published via its root), its leaf partitions, and the transactions
that created each and made it published, for the drain to judge (``pipeline.coverage``).

The WAL carries a published relation's rows only from the moment it is published. A relation
created already published (``CREATE TABLE ... PARTITION OF`` a published root, a table created
in a published schema or under ``FOR ALL TABLES``, or created and listed in one transaction)
has every row of its life in the WAL; one that joined later (``ALTER PUBLICATION ... ADD
TABLE``, ``ATTACH PARTITION``) may have held rows the WAL never carried. The catalog tells
them apart by transaction: the ``pg_attribute`` row of a relation's ``ctid`` is written once,
by the transaction that created it; its ``pg_inherits`` row by the one that made it a
partition; a ``pg_publication_rel`` or ``pg_publication_namespace`` row by the one that
published it. The catalog holds 32-bit transaction ids; each is read as the 64-bit one within
2^32 transactions before now (``_full``), and the drain never trusts one older than its last
check (its horizon).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from psycopg import sql

from airflow_pglogrepl.postgres.connect import Conn
from airflow_pglogrepl.tables import TableRef

__all__ = ["Leaf", "PublishedRelation", "SourceCoverage", "publication_coverage"]

_NOW = sql.SQL("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS now")

_NODES = sql.SQL(
    "WITH published AS ("
    " SELECT DISTINCT c.oid AS relid FROM pg_publication_tables pt"
    " JOIN pg_namespace n ON n.nspname = pt.schemaname"
    " JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename"
    " WHERE pt.pubname = ANY(%(pubs)s)),"
    " nodes AS ("
    " SELECT p.relid AS published, t.relid AS node, t.isleaf AS leaf"
    " FROM published p, pg_partition_tree(p.relid) t"
    " UNION SELECT p.relid, p.relid, c.relkind <> 'p' FROM published p"
    " JOIN pg_class c ON c.oid = p.relid"
    " UNION SELECT p.relid, a.relid, false FROM published p, pg_partition_ancestors(p.relid) a"
    " WHERE a.relid <> p.relid)"
    " SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS now,"
    " nodes.published::bigint AS published, nodes.node::bigint AS oid, nodes.leaf,"
    " c.xmin::text::bigint AS touched,"
    " n.nspname AS schema, c.relname AS name,"
    " (SELECT i.inhparent::bigint FROM pg_inherits i WHERE i.inhrelid = nodes.node) AS parent,"
    " (SELECT i.xmin::text::bigint FROM pg_inherits i WHERE i.inhrelid = nodes.node) AS linked,"
    " (SELECT i.cmin::text::bigint FROM pg_inherits i WHERE i.inhrelid = nodes.node)"
    " AS linked_at,"
    " (SELECT a.xmin::text::bigint FROM pg_attribute a"
    "  WHERE a.attrelid = nodes.node AND a.attnum = -1) AS created,"
    " (SELECT array_agg(pr.xmin::text::bigint ORDER BY pr.oid) FROM pg_publication_rel pr"
    "  JOIN pg_publication pb ON pb.oid = pr.prpubid"
    "  WHERE pb.pubname = ANY(%(pubs)s) AND pr.prrelid = nodes.node) AS listed,"
    " (SELECT array_agg(pr.cmin::text::bigint ORDER BY pr.oid) FROM pg_publication_rel pr"
    "  JOIN pg_publication pb ON pb.oid = pr.prpubid"
    "  WHERE pb.pubname = ANY(%(pubs)s) AND pr.prrelid = nodes.node) AS listed_at,"
    " (SELECT bool_or(pb.puballtables) FROM pg_publication pb"
    "  WHERE pb.pubname = ANY(%(pubs)s)) AS all_tables,"
    " {in_schema} AS in_schema, {in_schema_at} AS in_schema_at"
    " FROM nodes JOIN pg_class c ON c.oid = nodes.node"
    " JOIN pg_namespace n ON n.oid = c.relnamespace"
    " ORDER BY 1, 2"
)
_IN_SCHEMA = sql.SQL(
    "(SELECT array_agg(pn.xmin::text::bigint ORDER BY pn.oid) FROM pg_publication_namespace pn"
    " JOIN pg_publication pb ON pb.oid = pn.pnpubid"
    " WHERE pb.pubname = ANY(%(pubs)s) AND pn.pnnspid = c.relnamespace)"
)
_IN_SCHEMA_AT = sql.SQL(
    "(SELECT array_agg(pn.cmin::text::bigint ORDER BY pn.oid) FROM pg_publication_namespace pn"
    " JOIN pg_publication pb ON pb.oid = pn.pnpubid"
    " WHERE pb.pubname = ANY(%(pubs)s) AND pn.pnnspid = c.relnamespace)"
)
# Whether ``table`` holds a row its creating transaction ``xid`` inserted before command
# ``cid``, the one that made it published (linked it under a published root, listed it, or
# its schema): such rows were decoded as the table's own, unpublished then, so the WAL
# carries none of them as the published relation's. A committed row's ``cmin`` is the command
# that inserted it (one whose delete aborted may show that delete's: then a row is taken for
# early, which costs a repair and loses nothing).
_EARLY_ROWS = (
    "SELECT EXISTS (SELECT 1 FROM ONLY {table} WHERE xmin OPERATOR(pg_catalog.=)"
    " %(xid)s::text::pg_catalog.xid AND cmin::text::pg_catalog.int8 < %(cid)s) AS early"
)


@dataclass(frozen=True)
class Leaf:
    """A leaf partition (or the relation itself, when it is not partitioned)."""

    table: TableRef
    created: int  # the 64-bit id of the transaction that created it
    linked_then: bool  # made part of the relation when it was created, under older links


@dataclass(frozen=True)
class PublishedRelation:
    """A relation as pgoutput names it in its changes, and the leaves whose rows it carries.

    ``published``: when what publishes it was made (the newest of its memberships' 64-bit
    transaction ids; None under ``FOR ALL TABLES``, which publishes every table from its
    creation); ``membership``: those memberships' raw ids, by which a table removed from the
    publication and added again is told from one that stayed; ``linked_then``: every link up
    to what publishes it was there when it was created (or made by that transaction), and,
    published by its schema or ``FOR ALL TABLES``, its ``pg_class`` row unchanged since (a
    table moved into the schema, or made logged, holds rows the WAL never carried).
    """

    oid: int
    table: TableRef
    created: int
    created_raw: int
    published: int | None
    membership: tuple[int, ...]
    linked_then: bool
    leaves: dict[int, Leaf]


@dataclass(frozen=True)
class SourceCoverage:
    """The relations, and ``horizon``: the 64-bit transaction id every transaction that
    committed before this read is below (the next check trusts nothing older)."""

    horizon: int
    relations: list[PublishedRelation]


@dataclass(frozen=True)
class _Node:
    oid: int
    table: TableRef
    leaf: bool
    parent: int | None
    linked: int | None  # raw
    linked_at: int | None  # the command of its transaction that linked it
    created: int  # raw
    touched: int  # raw: its pg_class row's (a schema move, SET LOGGED, an ALTER: newer)
    listed: tuple[int, ...]  # raw
    in_schema: tuple[int, ...]  # raw
    all_tables: bool
    # (transaction, command) of each row that published it or its schema
    made_at: tuple[tuple[int, int], ...] = ()


def publication_coverage(
    conn: Conn, publications: Sequence[str], *, known: Collection[int] | None = None
) -> SourceCoverage:
    """Every relation ``publications`` publish now, as pgoutput sends it.

    ``known``: the relations and leaves (OIDs) the lake records. Any other made published by
    the transaction that created it is read for rows that transaction inserted before
    (``CREATE TABLE t; COPY t; ALTER TABLE root ATTACH PARTITION t`` in one transaction):
    with any, it was not published then. None: no table is read (its catalog alone judges)."""
    new = conn.info.server_version >= 150000
    none = sql.SQL("NULL::bigint[]")
    statement = _NODES.format(in_schema=_IN_SCHEMA if new else none,
                              in_schema_at=_IN_SCHEMA_AT if new else none)  # fmt: skip
    rows = conn.execute(statement, {"pubs": list(publications)})
    found = rows.fetchall()  # the horizon read in the catalog's own statement
    now = int(found[0]["now"] if found else conn.execute(_NOW).fetchone()["now"])  # type: ignore[index]
    trees: dict[int, dict[int, _Node]] = {}
    for row in found:
        trees.setdefault(int(row["published"]), {})[int(row["oid"])] = _Node(
            oid=int(row["oid"]),
            table=TableRef(row["schema"], row["name"]),
            leaf=bool(row["leaf"]),
            parent=None if row["parent"] is None else int(row["parent"]),
            linked=None if row["linked"] is None else int(row["linked"]),
            linked_at=None if row["linked_at"] is None else int(row["linked_at"]),
            created=int(row["created"]),
            touched=int(row["touched"]),
            listed=tuple(int(x) for x in row["listed"] or ()),
            in_schema=tuple(int(x) for x in row["in_schema"] or ()),
            all_tables=bool(row["all_tables"]),
            made_at=(*zip(row["listed"] or (), row["listed_at"] or (), strict=True),
                     *zip(row["in_schema"] or (), row["in_schema_at"] or (), strict=True)),
        )  # fmt: skip
    early = set() if known is None else _with_early_rows(conn, trees, set(known))
    relations = [_relation(oid, nodes, now, early) for oid, nodes in sorted(trees.items())]
    return SourceCoverage(horizon=now, relations=relations)


def _with_early_rows(conn: Conn, trees: dict[int, dict[int, _Node]], known: set[int]) -> set[int]:
    """The leaves not ``known`` that hold rows inserted, by the transaction that created them,
    before that transaction made them published (``_EARLY_ROWS``)."""
    early: set[int] = set()
    asked: set[int] = set(known)
    for nodes in trees.values():
        for node in nodes.values():
            if not node.leaf or node.oid in asked:
                continue
            asked.add(node.oid)
            made = [at for xid, at in _publishing(node, nodes) if xid == node.created]
            if not made:
                continue
            table = sql.Identifier(node.table.schema, node.table.name)
            query = sql.SQL(_EARLY_ROWS).format(table=table)
            row = conn.execute(query, {"xid": node.created, "cid": max(made)}).fetchone()
            if row is not None and row["early"]:
                early.add(node.oid)
    return early


def _publishing(node: _Node, nodes: dict[int, _Node]) -> list[tuple[int, int]]:
    """(transaction, command) of each catalog row that makes ``node``'s rows published: the
    links up its path, and what lists or holds the schema of each node on it."""
    made: list[tuple[int, int]] = []
    for each in _path_up(node, nodes):
        if each.parent in nodes and each.linked is not None and each.linked_at is not None:
            made.append((each.linked, each.linked_at))
        made.extend(each.made_at)
    return made


def _full(raw: int, now: int) -> int:
    """The 64-bit id of the 32-bit ``raw`` within the 2^32 transactions before ``now``."""
    return now - ((now - raw) % (1 << 32))


def _path_up(node: _Node, nodes: dict[int, _Node]) -> list[_Node]:
    """``node`` and its ancestors among ``nodes``, nearest first."""
    path = [node]
    while path[-1].parent is not None and path[-1].parent in nodes:
        path.append(nodes[path[-1].parent])
    return path


def _linked_then(path: Sequence[_Node], newest: _Node, now: int) -> bool:
    """Every link along ``path`` (each node to the next) made by the transaction that created
    ``newest`` or before it."""
    for child in path[:-1]:
        if child.linked is None:
            return False
        if child is newest:
            if child.linked != child.created:
                return False
        elif _full(child.linked, now) > _full(newest.created, now):
            return False
    return True


def _relation(oid: int, nodes: dict[int, _Node], now: int, early: set[int]) -> PublishedRelation:
    top = nodes[oid]
    path = _path_up(top, nodes)
    carrier = next((n for n in path if n.listed or n.in_schema), path[-1])
    memberships = (*carrier.listed, *carrier.in_schema)
    published = max((_full(x, now) for x in memberships), default=None)
    if published is None and not top.all_tables:
        published = now  # published by nothing this read could see: judged as just now
    leaves = {}
    for node in nodes.values():
        below = _path_up(node, nodes)
        if node.leaf and any(n.oid == oid for n in below):
            up_to = below[: [n.oid for n in below].index(oid) + 1]
            leaves[node.oid] = Leaf(node.table, _full(node.created, now),
                                    _linked_then(up_to, node, now)
                                    and node.oid not in early)  # fmt: skip
    return PublishedRelation(
        oid=oid,
        table=top.table,
        created=_full(top.created, now),
        created_raw=top.created,
        published=published,
        membership=tuple(sorted(memberships)),
        linked_then=_linked_then(path[: path.index(carrier) + 1], top, now)
        and (bool(carrier.listed) or top.touched == top.created)
        and top.oid not in early,
        leaves=leaves,
    )
