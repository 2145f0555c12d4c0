"""PostgreSQL dates and times as the lake stores them, including what Python cannot hold.

Delta Lake stores a ``date`` as days since 1970-01-01 (int32) and a timestamp as microseconds
since 1970-01-01 00:00 UTC (int64). Both reach far beyond what Python's ``datetime`` can hold
(years 1 to 9999), and every PostgreSQL date and nearly every timestamp fits. So BC dates and
years past 9999 are stored exactly, and the decoder's text for them (``'0044-03-15 BC'``,
``'12021-01-01 00:00:00+00'``) is turned into that count here.

``infinity`` and ``-infinity`` have no counterpart. They are stored as the largest and smallest
value of the column's storage: ``2**31 - 1`` / ``-2**31`` days and ``2**63 - 1`` / ``-2**63``
microseconds (the same numbers Debezium uses for timestamps). No real value is near them:
PostgreSQL's own range ends earlier.

``time`` has no Delta type at all: it is ``long`` microseconds since midnight, with
PostgreSQL's ``24:00:00`` as 86,400,000,000.
"""

from __future__ import annotations

import datetime as dt
import re

__all__ = [
    "DATE_INFINITY",
    "DATE_MINUS_INFINITY",
    "TIMESTAMP_INFINITY",
    "TIMESTAMP_MINUS_INFINITY",
    "date_days",
    "time_micros",
    "timestamp_micros",
]

DATE_INFINITY = 2**31 - 1
DATE_MINUS_INFINITY = -(2**31)
TIMESTAMP_INFINITY = 2**63 - 1
TIMESTAMP_MINUS_INFINITY = -(2**63)
_DAY_MICROS = 86_400_000_000
_EPOCH = dt.date(1970, 1, 1)
_EPOCH_ORDINAL = _EPOCH.toordinal()

# ISO output (DateStyle ISO): a year of 4 or more digits, an optional time and zone offset, and
# " BC" at the very end.
_ISO = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d)"
    r"(?: (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?"
    r"( BC)?"
)


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date; ``year`` is astronomical (1 BC = 0)."""
    year -= month <= 2
    era = year // 400
    year_of_era = year - era * 400
    day_of_year = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    return era * 146097 + day_of_era - 719468


def _parse(text: str) -> tuple[int, int]:
    """``(days since 1970, microseconds into that day in UTC)`` of an ISO date or timestamp."""
    match = _ISO.fullmatch(text)
    if match is None:
        raise ValueError(f"not an ISO date or timestamp: {text!r}")
    year, month, day, hour, minute, second, fraction, sign, oh, om, os_, bc = match.groups()
    astronomical = 1 - int(year) if bc else int(year)
    days = _days_from_civil(astronomical, int(month), int(day))
    micros = 0
    if hour is not None:
        micros = (int(hour) * 3600 + int(minute) * 60 + int(second)) * 1_000_000
        micros += int((fraction or "0").ljust(6, "0"))
    if sign is not None:
        offset = (int(oh) * 3600 + int(om or 0) * 60 + int(os_ or 0)) * 1_000_000
        micros -= offset if sign == "+" else -offset
    return days, micros


def date_days(value: dt.date | str) -> int:
    """Days since 1970-01-01 of a decoded ``date`` (a ``date``, or PostgreSQL's text)."""
    if isinstance(value, dt.date):
        return value.toordinal() - _EPOCH_ORDINAL
    if value == "infinity":
        return DATE_INFINITY
    if value == "-infinity":
        return DATE_MINUS_INFINITY
    return _parse(value)[0]


def timestamp_micros(value: dt.datetime | str) -> int:
    """Microseconds since 1970-01-01 00:00 UTC of a decoded ``timestamp`` or ``timestamptz``.

    A naive value (``timestamp``) counts as if it were UTC, as Delta's ``timestamp_ntz`` does.

    :raises ValueError: the value lies in the last 30 years of PostgreSQL's range (after
        294247-01-10), beyond a signed 64-bit count of microseconds since 1970.
    """
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        days = value.toordinal() - _EPOCH_ORDINAL
        clock = (value.hour * 3600 + value.minute * 60 + value.second) * 1_000_000
        return days * _DAY_MICROS + clock + value.microsecond
    if value == "infinity":
        return TIMESTAMP_INFINITY
    if value == "-infinity":
        return TIMESTAMP_MINUS_INFINITY
    days, micros = _parse(value)
    total = days * _DAY_MICROS + micros
    if not TIMESTAMP_MINUS_INFINITY < total < TIMESTAMP_INFINITY:
        raise ValueError(
            f"timestamp {value!r} is beyond what a 64-bit count of microseconds since 1970 holds"
        )
    return total


def time_micros(value: dt.time | str) -> int:
    """Microseconds since midnight of a decoded ``time`` (``'24:00:00'`` is a whole day)."""
    if isinstance(value, dt.time):
        return (value.hour * 3600 + value.minute * 60 + value.second) * 1_000_000 + (
            value.microsecond
        )
    if value.startswith("24:00:00"):
        return _DAY_MICROS
    raise ValueError(f"not a time of day: {value!r}")
