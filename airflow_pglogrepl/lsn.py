"""``LSN``: a PostgreSQL log sequence number as a value type.

A WAL position is a 64-bit byte offset. PostgreSQL prints it as two hexadecimal halves,
``"%X/%X"`` (high 32 bits / low 32 bits, upper case, no padding), and that text is what
``pg_lsn`` columns, ``pg_replication_slots`` and server logs show. Keeping it as an integer inside a
small type makes "how many bytes behind" a subtraction and window arithmetic an addition, while the
text form stays what a DBA can paste into ``psql``.
See https://www.postgresql.org/docs/15/datatype-pg-lsn.html
"""

from __future__ import annotations

import re
from functools import total_ordering
from typing import SupportsIndex, overload

from airflow_pglogrepl.exceptions.source import InvalidLSNError

__all__ = ["LSN"]

_MAX = (1 << 64) - 1
# pg_lsn_in accepts 1 to 8 hex digits on each side of the slash; so do we (no sign, no spaces).
_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


@total_ordering
class LSN:
    """An immutable, hashable WAL position.

    ``LSN("16/B374D848")`` parses text, ``LSN(0x16B374D848)`` wraps an integer. ``a - b`` of two
    LSNs is the distance in bytes (an ``int``, negative when ``a`` is behind ``b``);
    ``lsn + n`` / ``lsn - n`` move by ``n`` bytes and stay within 0 .. 2**64-1.
    """

    __slots__ = ("_value",)
    _value: int

    def __init__(self, value: str | SupportsIndex | LSN) -> None:
        if isinstance(value, LSN):
            number = value._value
        elif isinstance(value, str):
            number = _parse(value)
        elif isinstance(value, bool):  # bool is an int; True is never a meaningful WAL position
            raise InvalidLSNError(value, "a bool is not a WAL position")
        else:
            try:
                number = int(value.__index__())
            except (AttributeError, TypeError):
                raise InvalidLSNError(value, "expected text or an integer") from None
            if not 0 <= number <= _MAX:
                raise InvalidLSNError(value, "outside 0 .. 2**64-1")
        object.__setattr__(self, "_value", number)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("LSN is immutable")

    @staticmethod
    def from_server(value: int) -> LSN:
        """An LSN from a server's ``pg_lsn`` read as a signed int8 (values at or above 2**63
        arrive negative), without ``LSN()``'s argument checks: the server's value needs none,
        and a peek builds one per message (the checks cost about 0.35 us each)."""
        lsn = _new(LSN)
        _set_value(lsn, value + _U64 if value < 0 else value)
        return lsn

    @classmethod
    def parse(cls, text: str) -> LSN:
        """Parse PostgreSQL's text form, for example ``"0/16B3748"``."""
        return cls(text)

    @property
    def hi(self) -> int:
        """The high 32 bits (the "log id" half)."""
        return self._value >> 32

    @property
    def lo(self) -> int:
        """The low 32 bits (the offset half)."""
        return self._value & 0xFFFFFFFF

    def __int__(self) -> int:
        return self._value

    def __index__(self) -> int:
        return self._value

    def __str__(self) -> str:
        return f"{self.hi:X}/{self.lo:X}"

    def __repr__(self) -> str:
        return f"LSN('{self}')"

    def __hash__(self) -> int:
        return hash((LSN, self._value))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LSN):
            return self._value == other._value
        return NotImplemented

    def __lt__(self, other: object) -> bool:
        if isinstance(other, LSN):
            return self._value < other._value
        return NotImplemented

    def __add__(self, nbytes: int) -> LSN:
        if isinstance(nbytes, LSN) or not isinstance(nbytes, int):
            return NotImplemented
        return LSN(self._value + nbytes)

    __radd__ = __add__

    @overload
    def __sub__(self, other: LSN) -> int: ...

    @overload
    def __sub__(self, other: int) -> LSN: ...

    def __sub__(self, other: LSN | int) -> int | LSN:
        if isinstance(other, LSN):
            return self._value - other._value
        if isinstance(other, int):
            return LSN(self._value - other)
        return NotImplemented

    def bytes_since(self, earlier: LSN) -> int:
        """Bytes of WAL from ``earlier`` to here; typed alternative to ``self - earlier``."""
        return self._value - earlier._value

    def __reduce__(self) -> tuple[type[LSN], tuple[int]]:
        return (LSN, (self._value,))


def _parse(text: str) -> int:
    match = _TEXT.fullmatch(text)
    if match is None:
        raise InvalidLSNError(text)
    return (int(match.group(1), 16) << 32) | int(match.group(2), 16)


# LSN.from_server's fast path: the slot of the one attribute, set without __init__.
_new = object.__new__
_set_value = LSN.__dict__["_value"].__set__
_U64 = 1 << 64
