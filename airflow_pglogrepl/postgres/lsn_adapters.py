"""psycopg 3 adapters between :class:`~airflow_pglogrepl.lsn.LSN` and PostgreSQL's ``pg_lsn``.

Registered per connection by the hook (never globally), so other psycopg users in the same
process keep getting ``pg_lsn`` as text. Both wire formats are handled: ``pg_lsn``'s binary form
is an unsigned 64-bit big-endian integer (``pg_lsn_send`` in ``src/backend/utils/adt/pg_lsn.c``).
"""

from __future__ import annotations

import struct

from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format

from airflow_pglogrepl.lsn import LSN

PG_LSN_OID = 3220
_U64 = struct.Struct("!Q")


class LsnDumper(Dumper):
    """Sends an ``LSN`` as ``pg_lsn`` text, so ``%s`` needs no ``::pg_lsn`` cast."""

    oid = PG_LSN_OID

    def dump(self, obj: LSN) -> bytes:
        return str(obj).encode("ascii")


class LsnBinaryDumper(Dumper):
    """Sends an ``LSN`` in ``pg_lsn``'s binary form."""

    format = Format.BINARY
    oid = PG_LSN_OID

    def dump(self, obj: LSN) -> bytes:
        return _U64.pack(int(obj))


class LsnLoader(Loader):
    """Reads a ``pg_lsn`` text value as an ``LSN``."""

    def load(self, data: Buffer) -> LSN:
        return LSN(bytes(data).decode("ascii"))


class LsnBinaryLoader(Loader):
    """Reads a ``pg_lsn`` binary value as an ``LSN``."""

    format = Format.BINARY

    def load(self, data: Buffer) -> LSN:
        return LSN(_U64.unpack(bytes(data))[0])


def register_lsn_adapters(context: AdaptContext) -> None:
    """Make ``context`` (a connection or cursor) send and receive ``pg_lsn`` as ``LSN``."""
    adapters = context.adapters
    adapters.register_dumper(LSN, LsnDumper)
    adapters.register_dumper(LSN, LsnBinaryDumper)
    adapters.register_loader(PG_LSN_OID, LsnLoader)
    adapters.register_loader(PG_LSN_OID, LsnBinaryLoader)
