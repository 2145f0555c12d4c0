"""A run that dies after its tables' commits and before the window's commit point."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_pglogrepl.lake.lake import Lake
from airflow_pglogrepl.lake.window import Window
from airflow_pglogrepl.lsn import LSN


def commit_dying_before_the_point(
    monkeypatch: pytest.MonkeyPatch, window: Window, end: LSN, *, changes: int
) -> None:
    """``window.commit(end)`` killed at the commit point (``Lake.record``): every table of
    the window committed, the lake's position not moved."""

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("killed")

    with monkeypatch.context() as patched:
        patched.setattr(Lake, "record", crash)
        with pytest.raises(RuntimeError, match="killed"):
            window.commit(end, transactions=changes, changes=changes)
