"""Where a lake's tables live, and the app id its exactly-once bookkeeping is written under.

Layout under the lake root (a local path, ``file:`` URI or any URI Delta can write)::

    changes/<schema>.<table>/   Delta table: the append-only changelog of one source table
    state/<schema>.<table>/     Delta table: the table's current rows
    _pglogrepl/windows/         Delta table: one row per committed window (the lake's position)
    _pglogrepl/quarantine/      Delta table: changes of tables the lake could not store
    _pglogrepl/backfills/       Delta table: the online backfills in progress, and their chunks
    _pglogrepl/backfill/        Delta tables: the rows a backfill copied, until its state is built
    _pglogrepl/in_progress/     Arrow files, no table: rows of streamed transactions not yet
                                committed at the source, while a run reads them (never state)
    _pglogrepl/versions.json    JSON, no table: what each table was at the last look, so a run
                                reads only the logs of tables that moved (a cache, never state)

Every table is a plain Delta table, so Spark, Trino, DuckDB or the ``deltalake`` package read
any of them at a committed version; nothing else under the root is state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlparse

from airflow_pglogrepl.tables import TableRef

_SAFE = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
APP_PREFIX = "airflow-pglogrepl"


def table_dir(table: TableRef) -> str:
    """``schema.table`` for a directory name; other characters escaped (``~XX``, the UTF-8
    bytes in hex) so any name, including ones with ``/``, ``.`` or ``=``, maps to one safe,
    reversible directory.

    Not ``%XX``: delta-rs (and Hadoop's ``Path``) percent-decode a table's location, so a
    ``%3B`` directory would be written as one name and its log looked for under another.
    """
    return f"{_escape(table.schema)}.{_escape(table.name)}"


def table_from_dir(name: str) -> TableRef:
    """The inverse of ``table_dir``."""
    schema, _, table = name.partition(".")
    return TableRef(_unescape(schema), _unescape(table))


def _escape(part: str) -> str:
    text = "".join(ch if ch in _SAFE else _hex(ch) for ch in part)
    # Readers skip names starting with "_" (or "."): never start a directory that way.
    return "~5F" + text[1:] if text.startswith("_") else text


def _hex(ch: str) -> str:
    return "".join(f"~{byte:02X}" for byte in ch.encode())


_ESCAPED = re.compile(r"(?:~[0-9A-F]{2})+")


def _unescape(part: str) -> str:
    return _ESCAPED.sub(lambda m: bytes.fromhex(m.group(0).replace("~", "")).decode(), part)


# The app id of the lake's claims (``Lake.claim``) in ``_pglogrepl/windows``: a hyphen, which
# no slot name has, keeps it apart from every ``app_id(slot)``.
LAKE_APP = f"{APP_PREFIX}/lake-claims"


def app_id(slot: str) -> str:
    """The Delta ``txnAppId`` of the drain of ``slot``.

    Its transaction version in a table's log is the LSN that table includes. The lake is part of
    the identity already, because app transactions live inside each table's own log; leaving the
    path out keeps a lake's positions valid when it is copied or mounted elsewhere.
    """
    return f"{APP_PREFIX}/{slot}"


def is_local(uri: str) -> bool:
    """True for plain paths and ``file:`` URIs."""
    return urlparse(uri).scheme in ("", "file")


def local_path(uri: str) -> str:
    """The filesystem path of a local lake URI."""
    parsed = urlparse(uri)
    return parsed.path if parsed.scheme == "file" else uri


@dataclass(frozen=True)
class LakePaths:
    """The URIs of one lake's tables."""

    root: str

    def __post_init__(self) -> None:
        root = self.root.rstrip("/")
        object.__setattr__(self, "root", local_path(root) if is_local(root) else root)

    def _join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def changes(self, table: TableRef | str) -> str:
        return self._join("changes", table if isinstance(table, str) else table_dir(table))

    def state(self, table: TableRef | str) -> str:
        return self._join("state", table if isinstance(table, str) else table_dir(table))

    def history(self, table: TableRef | str) -> str:
        """Every version of the table's rows (``merge.history``)."""
        return self._join("history", table if isinstance(table, str) else table_dir(table))

    def windows(self) -> str:
        return self._join("_pglogrepl", "windows")

    def quarantine(self) -> str:
        return self._join("_pglogrepl", "quarantine")

    def coverage(self) -> str:
        """What the lake holds of each published relation (``lake.coverage``)."""
        return self._join("_pglogrepl", "coverage")

    def backfills(self) -> str:
        """The online backfills in progress (``lake.backfill``)."""
        return self._join("_pglogrepl", "backfills")

    def backfill_rows(self, table: TableRef | str, low: int) -> str:
        """Where one backfill of ``table`` keeps the chunks it copied (``low``: its start, so a
        backfill begun again never reads an earlier one's chunks)."""
        name = table if isinstance(table, str) else table_dir(table)
        return self._join("_pglogrepl", "backfill", f"{name}-{low:016X}")

    def in_progress(self) -> str:
        """Where rows of streamed transactions still in progress wait (``lake.in_progress``)."""
        return self._join("_pglogrepl", "in_progress")

    @property
    def local(self) -> bool:
        return is_local(self.root)
