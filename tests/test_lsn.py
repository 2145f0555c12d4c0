"""LSN parsing, formatting, ordering and arithmetic."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_pglogrepl.exceptions import InvalidLSNError
from airflow_pglogrepl.lsn import LSN

u64 = st.integers(min_value=0, max_value=2**64 - 1)


def test_parses_and_formats_postgres_text() -> None:
    lsn = LSN("16/B374D848")
    assert int(lsn) == 0x16_B374D848
    assert str(lsn) == "16/B374D848"
    assert repr(lsn) == "LSN('16/B374D848')"
    assert (lsn.hi, lsn.lo) == (0x16, 0xB374D848)


def test_parsing_is_case_insensitive_and_output_canonical() -> None:
    assert str(LSN("16/b374d848")) == "16/B374D848"
    assert str(LSN("00000000/0000000A")) == "0/A"
    assert str(LSN(0)) == "0/0"
    assert str(LSN("FFFFFFFF/FFFFFFFF")) == "FFFFFFFF/FFFFFFFF"


@given(u64)
def test_text_round_trip(value: int) -> None:
    lsn = LSN(value)
    assert LSN(str(lsn)) == lsn
    assert int(LSN(str(lsn))) == value
    assert str(lsn) == f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@given(u64, u64)
def test_ordering_agrees_with_integers(a: int, b: int) -> None:
    assert (LSN(a) < LSN(b)) == (a < b)
    assert (LSN(a) <= LSN(b)) == (a <= b)
    assert (LSN(a) == LSN(b)) == (a == b)
    assert (hash(LSN(a)) == hash(LSN(b))) or a != b
    assert sorted([LSN(a), LSN(b)]) == [LSN(x) for x in sorted([a, b])]


@given(u64, u64)
def test_subtraction_gives_bytes(a: int, b: int) -> None:
    assert LSN(a) - LSN(b) == a - b
    assert LSN(a).bytes_since(LSN(b)) == a - b


def test_adding_and_subtracting_bytes() -> None:
    assert LSN("0/FFFFFFFF") + 1 == LSN("1/0")
    assert 1 + LSN("0/FFFFFFFF") == LSN("1/0")
    assert LSN("1/0") - 1 == LSN("0/FFFFFFFF")
    with pytest.raises(InvalidLSNError):
        LSN("FFFFFFFF/FFFFFFFF") + 1
    with pytest.raises(InvalidLSNError):
        LSN(0) - 1


def test_lsn_plus_lsn_is_not_meaningful() -> None:
    with pytest.raises(TypeError):
        LSN(1) + LSN(2)  # type: ignore[operator]


def test_hashable_and_usable_as_key() -> None:
    assert {LSN("0/10"): "a"}[LSN(16)] == "a"
    assert len({LSN("0/10"), LSN(16), LSN("0/11")}) == 2


def test_copy_constructor_and_pickle() -> None:
    lsn = LSN("3/4")
    assert LSN(lsn) == lsn
    assert pickle.loads(pickle.dumps(lsn)) == lsn


def test_immutable() -> None:
    with pytest.raises(AttributeError):
        LSN(1)._value = 2  # type: ignore[misc]


def test_not_equal_to_text_or_int() -> None:
    assert LSN(16) != 16
    assert LSN(16) != "0/10"


@pytest.mark.parametrize(
    "text",
    ["abc", "1/", "/1", "1/2/3", "-1/0", "1/-0", "", " 1/0", "1/0 ", "0x1/0", "1/G",
     "100000000/0", "0/100000000", "1 /0", "+1/0"],
)  # fmt: skip
def test_invalid_text_raises_naming_it(text: str) -> None:
    with pytest.raises(InvalidLSNError) as info:
        LSN(text)
    assert repr(text) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [-1, 2**64, 2**70])
def test_integers_outside_64_bits_raise(value: int) -> None:
    with pytest.raises(InvalidLSNError) as info:
        LSN(value)
    assert str(value) in str(info.value)


@pytest.mark.parametrize("value", [1.5, None, b"0/1", True])
def test_other_types_raise(value: object) -> None:
    with pytest.raises(InvalidLSNError):
        LSN(value)  # type: ignore[arg-type]


def test_from_server_reads_a_signed_int8_without_checks_and_equals_the_checked_lsn() -> None:
    """The peek's fast path: pg_lsn read as int8, 2**63 and above arriving negative."""
    assert LSN.from_server(0x16B374D848) == LSN("16/B374D848")
    assert LSN.from_server(-1) == LSN("FFFFFFFF/FFFFFFFF")
    assert LSN.from_server(-(1 << 63)) == LSN(1 << 63)
    made = LSN.from_server(42)
    assert type(made) is LSN and hash(made) == hash(LSN(42))
    with pytest.raises(AttributeError):
        made._value = 1  # type: ignore[misc]
