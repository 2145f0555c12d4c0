"""The relation cache: what Relation and Type messages said about each table and type.

pgoutput describes a table once per decoding session, in a Relation message before its first
change (and again after DDL); later data messages carry only its OID. A Type message names a
column type that is not built in (a domain's is its base type). ``RelationCache`` keeps both,
builds each table's ``TableInfo`` with the value type of every column, and finds a table by
OID for a data message. ``PgOutputStream`` keeps one (plus the descriptions a streamed
transaction sends, which count only once it commits), and so does the columnar decoder, which
hands it the raw messages (``feed``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from airflow_pglogrepl.exceptions import DecodeError, UnknownRelationError
from airflow_pglogrepl.pgoutput.messages import RelationMessage, TypeMessage, message_type_name
from airflow_pglogrepl.pgoutput.parser import check_protocol_version, decode_message
from airflow_pglogrepl.pgoutput.table_info import ColumnInfo, TableInfo
from airflow_pglogrepl.pgoutput.values import value_type

__all__ = ["RelationCache"]

_U32_PACK = struct.Struct("!I").pack


class RelationCache:
    """Relation OID -> current ``TableInfo``, and type OID -> its Type message.

    :param proto_version: the ``proto_version`` the messages ``feed`` gets were read with.

    ``tables`` and ``fast_tables`` are changed in place, never replaced: a reader may keep them.
    """

    __slots__ = ("_proto_version", "_types", "fast_tables", "tables")

    def __init__(self, *, proto_version: int = 1) -> None:
        check_protocol_version(proto_version)
        self._proto_version = proto_version
        self.tables: dict[int, TableInfo] = {}
        # the same tables keyed by their OID's 4 bytes and the 'N' marker, for the stream's
        # inline path (one dict probe on a plain Insert/Update's bytes 1 to 5)
        self.fast_tables: dict[bytes, TableInfo] = {}
        self._types: dict[int, TypeMessage] = {}

    def scoped(self, overlay: Mapping[int, TableInfo]) -> RelationCache:
        """A cache for one block of a streamed transaction: this one's tables and ``overlay``
        (that transaction's own descriptions) on top, the types shared. What a block describes
        stays in the new cache, so other transactions go on with this one's."""
        scoped = RelationCache(proto_version=self._proto_version)
        scoped._types = self._types  # a Type message counts for everyone, as the reference's
        for table in (*self.tables.values(), *overlay.values()):
            scoped.describe(table)
        return scoped

    def feed(self, data: bytes) -> None:
        """Apply a Relation or Type message that arrived outside a stream block.

        :raises DecodeError: the message is malformed, or of another type.
        """
        message = decode_message(data, proto_version=self._proto_version)
        if isinstance(message, RelationMessage):
            self.describe(self.relation(message))
        elif isinstance(message, TypeMessage):
            self.add_type(message)
        else:
            raise DecodeError(message_type_name(data[0]), 0, "not a Relation or Type message")

    def relation(self, message: RelationMessage) -> TableInfo:
        """The table a Relation message describes, with the types known so far; it becomes
        current only through ``describe`` (a streamed transaction's waits for its commit)."""
        columns = [
            ColumnInfo(
                c.name,
                c.type_oid,
                c.type_modifier,
                c.is_key,
                self.value_type(c.type_oid),
                self.type_name(c.type_oid),
            )
            for c in message.columns
        ]
        return TableInfo(
            message.namespace,
            message.name,
            columns,
            relation_id=message.relation_id,
            replica_identity=message.replica_identity,
        )

    def describe(self, table: TableInfo) -> None:
        """Make ``table`` the current description of its relation."""
        assert table.relation_id is not None
        self.tables[table.relation_id] = table
        self.fast_tables[_U32_PACK(table.relation_id) + b"N"] = table

    def add_type(self, message: TypeMessage) -> None:
        """Remember what a Type message says (for the Relation messages that follow)."""
        self._types[message.type_oid] = message

    def value_type(self, type_oid: int) -> int | None:
        """The type a column of ``type_oid`` converts as (``values.value_type``)."""
        described = self._types.get(type_oid)  # a domain's: its base type
        base = None if described is None else (described.namespace, described.name)
        return value_type(type_oid, base)

    def type_name(self, type_oid: int) -> str | None:
        """``namespace.name`` of a type a Type message described, else None."""
        described = self._types.get(type_oid)
        return None if described is None else f"{described.namespace}.{described.name}"

    def table(
        self, relation_id: int, mtype: str, overlay: Mapping[int, TableInfo] | None = None
    ) -> TableInfo:
        """The table a data message names, looked up first in ``overlay`` (the descriptions
        of the streamed transaction whose block is open, whose OID comes after its xid).

        :raises UnknownRelationError: no Relation message described it.
        """
        if overlay is not None:
            table = overlay.get(relation_id)
            if table is not None:
                return table
        table = self.tables.get(relation_id)
        if table is None:
            raise UnknownRelationError(mtype, 1 if overlay is None else 5, relation_id)
        return table
