"""``TableRef``: a schema-qualified table name, parsed the way PostgreSQL reads one; ``Column``:
one column of a table as the catalog describes it.

DAG authors write table lists as text (``public.orders``, ``"Sales"."Q1 report"``).
Unquoted parts fold to lower case and quoted parts are taken verbatim, exactly as in SQL, so a
name means the same table here as in ``psql``. Statements never use the text: the hook composes
``psycopg.sql.Identifier(schema, name)`` from the two parts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_SCHEMA = "public"


@dataclass(frozen=True, order=True)
class TableRef:
    """A table: ``schema`` and ``name`` exactly as stored in the catalog (already unquoted)."""

    schema: str
    name: str

    @classmethod
    def parse(cls, text: str | TableRef | tuple[str, str]) -> TableRef:
        """Parse ``orders``, ``sales.orders``, ``"My Schema"."Orders"`` or a (schema, name) pair."""
        if isinstance(text, TableRef):
            return text
        if isinstance(text, tuple):
            schema, name = text
            return cls(schema, name)
        parts = _split_qualified(text)
        if len(parts) == 1:
            return cls(DEFAULT_SCHEMA, parts[0])
        if len(parts) == 2:
            return cls(parts[0], parts[1])
        raise ValueError(
            f"table name {text!r} has {len(parts)} dot-separated parts; write schema.table "
            f"(double-quote a part that contains a dot)"
        )

    def __str__(self) -> str:
        """The qualified name, quoted only where PostgreSQL needs it (for logs and XCom)."""
        return f"{_quote_if_needed(self.schema)}.{_quote_if_needed(self.name)}"


def parse_tables(tables: Iterable[str | TableRef | tuple[str, str]]) -> list[TableRef]:
    """Parse a table list, rejecting duplicates (after folding) with the offending name."""
    result: list[TableRef] = []
    seen: set[TableRef] = set()
    for item in tables:
        ref = TableRef.parse(item)
        if ref in seen:
            raise ValueError(f"table {ref} is listed twice")
        seen.add(ref)
        result.append(ref)
    return result


def _split_qualified(text: str) -> list[str]:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty or non-text table name {text!r}")
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == '"':
            i += 1
            buf: list[str] = []
            while True:
                end = text.find('"', i)
                if end < 0:
                    raise ValueError(f"unterminated quoted identifier in table name {text!r}")
                buf.append(text[i:end])
                if end + 1 < n and text[end + 1] == '"':  # "" is a literal quote
                    buf.append('"')
                    i = end + 2
                    continue
                i = end + 1
                break
            part = "".join(buf)
        else:
            start = i
            while i < n and text[i] != "." and not text[i].isspace():
                if text[i] == '"':
                    raise ValueError(f"misplaced quote in table name {text!r}")
                i += 1
            part = text[start:i].lower()
        if not part:
            raise ValueError(f"empty identifier in table name {text!r}")
        parts.append(part)
        while i < n and text[i].isspace():
            i += 1
        if i == n:
            return parts
        if text[i] != ".":
            raise ValueError(f"unexpected {text[i]!r} in table name {text!r}")
        i += 1


def _quote_if_needed(ident: str) -> str:
    plain = (
        ident
        and (ident[0].isalpha() or ident[0] == "_")
        and all(ch.isdigit() or ch == "_" or ("a" <= ch <= "z") for ch in ident)
    )
    if plain:
        return ident
    return '"' + ident.replace('"', '""') + '"'


@dataclass(frozen=True)
class Column:
    """One live column of a table (``pg_attribute``: ``attnum > 0``, not dropped), as
    ``postgres.columns`` reads it: the one column model of the preflight, the snapshot and the
    lake's schema evolution.

    ``type`` is ``format_type()`` text (``character varying(20)``), ``type_oid`` and
    ``type_modifier`` what pgoutput sends; ``base_namespace``/``base_name`` the base type of a
    domain (the type itself otherwise), as pgoutput's Type message names it. ``identity`` is
    ``attidentity`` (``''``, ``'a'`` always, ``'d'`` by default), ``generated`` ``attgenerated``
    (``''`` or ``'s'`` stored). ``missing`` is the value rows older than the column read
    (``attmissingval``, as the type prints it), read only where asked for. ``is_key``: part of
    what pgoutput sends as the key (the replica identity; every column under FULL), set by the
    snapshot, which alone needs it.
    """

    name: str
    type: str
    not_null: bool = False
    has_default: bool = False
    identity: str = ""
    generated: str = ""
    attnum: int = 0
    type_oid: int = 0
    type_modifier: int = -1
    base_namespace: str = "pg_catalog"
    base_name: str = ""
    missing: str | None = None
    is_key: bool = False

    @property
    def fills_itself(self) -> bool:
        """True when an INSERT that omits this column still gets a value (default, identity)."""
        return self.has_default or bool(self.identity) or bool(self.generated)
