"""DAG arguments operators share: name lists and the tables they act on.

Templated arguments arrive as one name, a list, or nothing; the fence, sequences, parity and
finalize all read them the same way, so they are read here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
    from airflow_pglogrepl.tables import TableRef

__all__ = ["names", "resolve_tables"]


def names(value: str | Sequence[str] | None) -> list[str]:
    """A role or table list from a DAG argument: one name, a list, or nothing."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(item) for item in value]


def resolve_tables(
    hook: PgLogicalReplicationHook, tables: Sequence[str], publication: str | None
) -> list[TableRef]:
    """The tables named, plus every table of ``publication`` (read on the hook's server)."""
    from airflow_pglogrepl.exceptions import ObjectNotFoundError
    from airflow_pglogrepl.tables import parse_tables

    refs = parse_tables(tables)
    if publication:
        published = hook.publication_tables(publication)
        if published is None:
            raise ObjectNotFoundError(
                "publication", publication, "create it first or check the connection's database"
            )
        refs += [t for t in published if t not in refs]
    if not refs:
        raise ValueError("no tables: give tables=[...] or a publication that has tables")
    return refs
