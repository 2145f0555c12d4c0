"""DAG arguments operators share: name lists, the tables they act on, and the lake root.

Templated arguments arrive as one name, a list, or nothing; the fence, sequences, parity and
finalize all read them the same way, so they are read here. The lake operators take the lake
root as ``lake=`` (once ``sink=``, still accepted with a warning).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
    from airflow_pglogrepl.tables import TableRef

__all__ = ["OldSinkName", "lake_argument", "lake_keys", "names", "resolve_tables"]


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


def lake_argument(operator: str, lake: str | None, sink: str | None) -> str:
    """The lake root an operator was given: ``lake``, or its old name ``sink`` (with a warning
    that names the new one); never neither.

    Both, and different, is a DAG moving to the new name with ``sink`` still in its
    ``default_args``: ``lake``, the explicit argument, wins, as an explicit argument wins over
    ``default_args``, and the warning says ``sink`` was ignored. No message repeats either
    value: a lake URI may carry a secret (``hooks.object_store.check_lake_uri`` refuses it
    later, without repeating it either)."""
    if sink is not None:
        from airflow_pglogrepl._moved import warn_caller

        if lake is None or lake == sink:
            warn_caller(
                f"{operator}: sink= is now lake= (the same lake root); the old name goes in a "
                "later release"
            )
            return sink
        warn_caller(
            f"{operator}: got lake= and sink= (lake's old name, from the task or default_args) "
            "with different lake roots: lake= is used and sink= ignored; remove sink="
        )
    if lake is None:
        raise TypeError(f"{operator} needs lake=: the lake root, a path or s3://bucket/prefix")
    return lake


class OldSinkName:
    """``task.sink``: an operator's lake root under its old name, for templates
    (``{{ task.sink }}``) and subclasses that read or set it; warns, as ``sink=`` does."""

    lake: str

    @property
    def sink(self) -> str:
        self._old_name_used()
        return self.lake

    @sink.setter
    def sink(self, value: str) -> None:
        self._old_name_used()
        self.lake = value

    def _old_name_used(self) -> None:
        from airflow_pglogrepl._moved import warn_caller

        warn_caller(f"{type(self).__name__}: .sink is now .lake; the old name goes in a later "
                    "release")  # fmt: skip


def lake_keys(root: str) -> dict[str, str]:
    """The lake root as a task's summary (its XCom return value) gives it: ``lake``, and
    ``sink``, the key's old name, for DAGs that read it until a later release."""
    return {"lake": root, "sink": root}
