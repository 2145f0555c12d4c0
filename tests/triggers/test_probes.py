"""ProgressProbe: impossible setups are rejected and a bad target LSN is named."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import InvalidLSNError
from airflow_pglogrepl.triggers.probes import ProgressProbe


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slot_name": "s", "max_lag_bytes": 1}, "publisher_conn_id"),
        ({"subscription": "x", "target_lsn": "0/1"}, "subscriber_conn_id"),
        ({"publisher_conn_id": "p", "max_lag_bytes": 1}, "name a slot"),
        ({"publisher_conn_id": "p", "slot_name": "s"}, "max_lag_bytes, target_lsn"),
        ({"subscriber_conn_id": "s", "subscription": "x", "max_lag_bytes": 5}, "name the slot"),
    ],
)
def test_impossible_probes_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProgressProbe(**kwargs)  # type: ignore[arg-type]


def test_bad_target_lsn_is_named() -> None:
    with pytest.raises(InvalidLSNError, match="'fence'"):
        ProgressProbe(publisher_conn_id="p", slot_name="s", target_lsn="fence")
