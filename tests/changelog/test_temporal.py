"""Dates and times as the lake stores them: PostgreSQL's text and Python's values give the same
numbers wherever both exist, and the text goes where Python cannot (BC, years past 9999,
infinities), with a clear error past what 64 bits of microseconds hold."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_pglogrepl.changelog import temporal

OFFSETS = st.integers(-15 * 3600, 15 * 3600).map(lambda s: dt.timezone(dt.timedelta(seconds=s)))


def iso(value: dt.datetime) -> str:
    """``value`` as PostgreSQL prints it with DateStyle ISO (offsets to the second)."""
    text = f"{value.year:04d}-{value:%m-%d %H:%M:%S}"  # PostgreSQL pads years to 4 digits
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    offset = value.utcoffset()
    if offset is not None:
        seconds = int(offset.total_seconds())
        sign, seconds = ("+" if seconds >= 0 else "-"), abs(seconds)
        text += f"{sign}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"
        text += f":{seconds % 60:02d}" if seconds % 60 else ""
    return text


@given(st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30)),
       st.one_of(st.none(), OFFSETS))  # fmt: skip
def test_text_and_python_values_give_the_same_microseconds(
    value: dt.datetime, zone: dt.timezone | None
) -> None:
    value = value.replace(tzinfo=zone)
    assert temporal.timestamp_micros(iso(value)) == temporal.timestamp_micros(value)
    assert temporal.date_days(value.date().isoformat()) == temporal.date_days(value.date())


def test_what_python_cannot_hold() -> None:
    assert temporal.date_days("0001-01-01 BC") == temporal.date_days("0001-01-01") - 366  # year 0
    assert temporal.date_days("10000-01-01") == temporal.date_days("9999-12-31") + 1
    assert temporal.date_days("infinity") == temporal.DATE_INFINITY
    assert temporal.timestamp_micros("-infinity") == temporal.TIMESTAMP_MINUS_INFINITY
    assert temporal.time_micros("24:00:00") == 86_400_000_000
    assert temporal.time_micros(dt.time(1, 2, 3, 4)) == 3_723_000_004


def test_past_64_bits_of_microseconds_is_a_clear_error() -> None:
    assert temporal.timestamp_micros("294247-01-09 00:00:00") > 0
    with pytest.raises(ValueError, match="64-bit count of microseconds"):
        temporal.timestamp_micros("294277-01-01 00:00:00")
    with pytest.raises(ValueError, match="not an ISO date"):
        temporal.date_days("01/02/2026")
    with pytest.raises(ValueError, match="not a time of day"):
        temporal.time_micros("25:00:00")
