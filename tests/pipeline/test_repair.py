"""The base of a drain's repairs: one that does its work when called has nothing to do after
a window, waits for nothing and reports nothing, so a run given it ends with its windows."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.lsn import LSN
from airflow_pglogrepl.pipeline.repair import Repair


def test_the_base_repair_has_no_work_across_windows() -> None:
    repair = Repair()
    assert repair.in_progress() == [] and not repair.pending()
    assert repair.after_window(LSN("0/10")) is None
    assert repair.waiting_for() is None and repair.report() == repair.parity_report() == {}
    with pytest.raises(NotImplementedError):
        repair({})
