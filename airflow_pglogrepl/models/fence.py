"""The write fence's records: what it took from each role (kept in the publisher's catalogs as
the text of a role setting), what applying, guarding and releasing it did, and the sessions that
could still write.

A fence's state is stored per role and database as the placeholder setting
``pglogrepl.fence_state``, a compact JSON text (``RoleFence.to_json``): a catalog row, so a
retried fence never forgets its first run's grants and a release restores exactly them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_pglogrepl.models.records import Record
from airflow_pglogrepl.tables import TableRef

FENCE_STATE_SETTING = ("pglogrepl", "fence_state")
FENCE_STATE_NAME = ".".join(FENCE_STATE_SETTING)
FENCE_PRIVILEGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE")
FENCE_MESSAGE_PREFIX = "pglogrepl.fence"
READ_ONLY_SETTING = "default_transaction_read_only"


@dataclass(frozen=True, order=True)
class FenceGrant(Record):
    """One table privilege the fence took from a role (and gives back on release)."""

    table: TableRef
    privilege: str
    grantable: bool = False


@dataclass(frozen=True)
class RoleFence(Record):
    """What the fence changed for one role in one database; release restores exactly this.

    ``previous_read_only`` is the role's own ``default_transaction_read_only`` setting in this
    database before the fence (``None``: it had none), meaningful when ``read_only_set``.
    """

    role: str
    read_only_set: bool = False
    previous_read_only: str | None = None
    grants: tuple[FenceGrant, ...] = ()

    def to_json(self) -> str:
        """The compact text stored in ``pglogrepl.fence_state``."""
        return json.dumps(
            {
                "v": 1,
                "ro": self.read_only_set,
                "prev": self.previous_read_only,
                "grants": [
                    [g.table.schema, g.table.name, g.privilege, g.grantable] for g in self.grants
                ],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, role: str, text: str) -> RoleFence:
        """Parse what ``to_json`` stored; an unknown format version raises ``ValueError``."""
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError(f"role {role!r}: unknown {FENCE_STATE_NAME} format {text[:80]!r}")
        return cls(
            role=role,
            read_only_set=bool(data.get("ro")),
            previous_read_only=data.get("prev"),
            grants=tuple(
                sorted(FenceGrant(TableRef(s, n), str(p), bool(g)) for s, n, p, g in data["grants"])
            ),
        )

    def with_grants(self, grants: Iterable[FenceGrant]) -> RoleFence:
        """This state plus ``grants`` (one entry per table and privilege)."""
        merged = {(g.table, g.privilege): g for g in self.grants}
        for grant in grants:
            merged.setdefault((grant.table, grant.privilege), grant)
        return RoleFence(
            self.role, self.read_only_set, self.previous_read_only, tuple(sorted(merged.values()))
        )


@dataclass(frozen=True)
class FenceApplied(Record):
    """The fence after ``apply_write_fence``: saved state per role and what this call changed.

    ``fenced_at`` is the server's clock just after the fence committed: a transaction that
    started later cannot write to the fenced tables (revoke) or starts read-only (read_only).
    """

    fenced_at: dt.datetime
    tables: tuple[TableRef, ...]
    states: tuple[RoleFence, ...]
    changes: tuple[str, ...]

    dict_names = {"states": "saved"}


@dataclass(frozen=True)
class FenceReleased(Record):
    """What releasing the fence of one role restored (``restored`` is empty when not fenced)."""

    role: str
    fenced: bool
    restored: tuple[FenceGrant, ...] = ()
    read_only_restored_to: str | None = None
    missing_tables: tuple[TableRef, ...] = ()


@dataclass(frozen=True)
class FencedBackend(Record):
    """A session of a fenced role that could still commit a write (see ``fence_backends``)."""

    pid: int
    role: str
    state: str | None
    xact_start: dt.datetime | None
    backend_start: dt.datetime
    application_name: str


@dataclass(frozen=True)
class GuardOutcome(Record):
    """What ``guard_write_fence`` did: ``installed``, or the lock ``holders`` it waited for
    (``pid`` and ``gid``: a prepared transaction has no pid)."""

    installed: bool
    members: tuple[str, ...]
    holders: tuple[dict[str, Any], ...]


def parse_role_settings(setconfig: Sequence[str] | None) -> dict[str, str]:
    """``pg_db_role_setting.setconfig`` (``name=value`` items) as a dict."""
    result: dict[str, str] = {}
    for item in setconfig or ():
        name, sep, value = item.partition("=")
        if sep:
            result[name] = value
    return result


def grouped(grants: Iterable[FenceGrant]) -> dict[tuple[TableRef, bool], list[str]]:
    groups: dict[tuple[TableRef, bool], list[str]] = {}
    for grant in sorted(grants):
        groups.setdefault((grant.table, grant.grantable), []).append(grant.privilege)
    return groups
