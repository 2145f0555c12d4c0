"""Small text helpers for findings: identifiers quoted for copy-paste, counted nouns."""

from __future__ import annotations

from collections.abc import Iterable


def ident(name: str) -> str:
    """``name`` double-quoted as an SQL identifier, so a statement in a fix can be pasted."""
    return '"' + name.replace('"', '""') + '"'


def idents(names: Iterable[str]) -> str:
    """``"a", "b"``."""
    return ", ".join(ident(n) for n in names)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 table``, ``2 tables``."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
