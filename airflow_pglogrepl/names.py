"""Checks on names PostgreSQL restricts beyond ordinary identifiers.

Most object names (tables, publications) are composed with ``psycopg.sql.Identifier`` and may
hold any character. Replication slot names may not: the server accepts only ``[a-z0-9_]``
(``ReplicationSlotValidateName`` in ``src/backend/replication/slot.c``). Checking here gives the
user one clear message before any statement is built.
"""

from __future__ import annotations

import re

from airflow_pglogrepl.exceptions import InvalidSlotNameError

NAMEDATALEN = 64  # PostgreSQL truncates identifiers to NAMEDATALEN - 1 bytes
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")


def validate_slot_name(name: str) -> str:
    """Return ``name`` unchanged if PostgreSQL would accept it as a slot name, else raise."""
    if not isinstance(name, str) or _SLOT_NAME.fullmatch(name) is None:
        raise InvalidSlotNameError(str(name))
    return name
