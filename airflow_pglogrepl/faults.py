"""Crash injection for the crash-safety tests: die abruptly at a named point of a run.

``PGLOGREPL_FAULT=<point>[:<n>]`` kills the process (exit status 137, nothing cleaned up) the
n-th time (default: first) it passes ``fault(point)``. Unset, ``fault`` costs one dictionary
lookup. The points are named where they are placed (the drain, the merge, the snapshot).
"""

from __future__ import annotations

import os

FAULT_ENV = "PGLOGREPL_FAULT"


def fault(point: str) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    counter = f"_PGLOGREPL_FAULT_COUNT_{point}"
    count = int(os.environ.get(counter, "0")) + 1
    os.environ[counter] = str(count)
    if count >= int(nth or "1"):
        os._exit(137)
