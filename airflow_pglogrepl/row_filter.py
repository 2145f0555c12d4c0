"""Row filters: the one piece of SQL a DAG author writes, checked to stay one expression.

A publication's row filter (``WHERE (...)``, PostgreSQL 15+) is an expression PostgreSQL itself
restricts (columns, constants, built-in immutable operators and functions). It cannot be a bound
parameter, so it is pasted into the DDL, between parentheses. What it must never do is leave
them: ``true) , other_table WHERE (true`` would publish another table, a ``--`` comment would
swallow the closing parenthesis. ``check_row_filter`` scans the text as PostgreSQL's lexer
would (string literals, quoted identifiers, comments, dollar quotes), with
``standard_conforming_strings`` on (the publication's session sets it), and refuses anything but
a single parenthesis-balanced expression; a statement can also never be stacked after it (the
DDL goes through the extended protocol, one statement only). Row filters are code written by
the DAG author, not values: the operators do not template them, so a DAG run's ``conf`` never
reaches one.
"""

from __future__ import annotations

__all__ = ["check_row_filter"]


def check_row_filter(text: str, *, table: str) -> str:
    """``text`` if it is one parenthesis-balanced expression with no comment, ``;``, dollar
    quote or top-level comma; ``ValueError`` naming ``table`` and the reason otherwise."""

    def refuse(reason: str) -> ValueError:
        return ValueError(
            f"row filter of {table} {text!r}: {reason}. A row filter is one expression over the "
            f"table's columns (e.g. region = 'eu' AND NOT deleted)"
        )

    depth = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "'":
            # an E'' string (backslash escapes) when the E starts a token of its own
            escapes = i > 0 and text[i - 1] in "eE" and (i < 2 or not _in_word(text[i - 2]))
            i = _skip_quoted(text, i, "'", backslash=escapes)
            if i < 0:
                raise refuse("a string literal is not closed")
            continue
        if ch == '"':
            i = _skip_quoted(text, i, '"', backslash=False)
            if i < 0:
                raise refuse("a quoted identifier is not closed")
            continue
        if text.startswith("--", i) or text.startswith("/*", i):
            raise refuse("comments are not allowed")
        if ch == ";":
            raise refuse("';' is not allowed")
        if ch == "$":
            raise refuse("'$' (dollar quoting, parameters) is not allowed")
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise refuse("a ')' closes more than the filter opened")
        elif ch == "," and depth == 0:
            raise refuse("a ',' outside parentheses is not allowed")
        i += 1
    if depth:
        raise refuse("a '(' is not closed")
    if not text.strip():
        raise refuse("it is empty")
    return text


def _in_word(ch: str) -> bool:
    return ch.isalnum() or ch in "_$"


def _skip_quoted(text: str, start: int, quote: str, *, backslash: bool) -> int:
    """The index after the quoted run opening at ``start`` (doubled quotes, and backslash
    escapes in an ``E''`` string, stay inside); -1 when it never closes."""
    i = start + 1
    while i < len(text):
        ch = text[i]
        if backslash and ch == "\\":
            i += 2
            continue
        if ch == quote:
            if i + 1 < len(text) and text[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    return -1
