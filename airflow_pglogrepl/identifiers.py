"""PostgreSQL's identifier rules where a statement cannot simply quote a name: slot names, and
the publication names pgoutput takes as one option.

Most object names (tables, publications) are composed with ``psycopg.sql.Identifier`` and may
hold any character. Replication slot names may not: the server accepts only ``[a-z0-9_]``
(``ReplicationSlotValidateName`` in ``src/backend/replication/slot.c``). Checking here gives the
user one clear message before any statement is built. pgoutput's ``publication_names`` is a
list of identifiers in one string, quoted and split here as the server splits it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from airflow_pglogrepl.exceptions import InvalidSlotNameError

NAMEDATALEN = 64  # PostgreSQL truncates identifiers to NAMEDATALEN - 1 bytes
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")


def validate_slot_name(name: str) -> str:
    """Return ``name`` unchanged if PostgreSQL would accept it as a slot name, else raise."""
    if not isinstance(name, str) or _SLOT_NAME.fullmatch(name) is None:
        raise InvalidSlotNameError(str(name))
    return name


_SPACE = " \t\n\r\f\v"  # scanner_isspace


def publication_names_option(names: Sequence[str]) -> str:
    """pgoutput's ``publication_names`` for ``names``: each quoted as an identifier, so any
    name (commas, quotes, case) reaches the server as it is. ``publication_list`` reads it
    back."""
    return ",".join('"' + name.replace('"', '""') + '"' for name in names)


def publication_list(options: Mapping[str, str]) -> list[str]:
    """The publications pgoutput's ``publication_names`` option names: a comma-separated list
    of identifiers as the server splits it (``SplitIdentifierString``): double quotes keep case
    and commas, ``""`` is a quote, unquoted names fold A-Z to lower case (only those), and a
    name is cut to 63 bytes as the server cuts identifiers. A list the server would refuse
    (an unclosed quote) is read as far as it goes: the server's own error follows."""
    text = options.get("publication_names", "")
    names: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in _SPACE:
            i += 1
        if i < n and text[i] == '"':
            name, i = [], i + 1
            while i < n:
                if text[i] == '"':
                    if i + 1 < n and text[i + 1] == '"':
                        name.append('"')
                        i += 2
                        continue
                    i += 1
                    break
                name.append(text[i])
                i += 1
            names.append(_truncated("".join(name)))
        else:
            start = i
            while i < n and text[i] != "," and text[i] not in _SPACE:
                i += 1
            if i > start:
                names.append(_truncated(_ascii_lower(text[start:i])))
        while i < n and text[i] != ",":
            i += 1
        i += 1
    return names


def _ascii_lower(name: str) -> str:
    return name.translate(_FOLD)


_FOLD = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _truncated(name: str) -> str:
    """Cut to NAMEDATALEN - 1 bytes of UTF-8, never inside a character."""
    raw = name.encode()
    if len(raw) < NAMEDATALEN:
        return name
    return raw[: NAMEDATALEN - 1].decode(errors="ignore")
