"""Crash and pause injection for the failure tests: stop at a named point of a run.

``PGLOGREPL_FAULT=<point>[:<n>]`` kills the process (exit status 137, nothing cleaned up) the
n-th time (default: first) it passes ``fault(point)``. ``PGLOGREPL_PAUSE=<point>:<directory>``
makes ``pause(point)`` leave a file ``<point>.<pid>`` in the directory and wait until a file
``go`` appears there (at most ``PAUSE_LIMIT_S``): a test does something in the middle of a
run, then lets it go on. Unset, each costs one dictionary lookup. The points are named where
they are placed (the drain, the merge, the snapshot).
"""

from __future__ import annotations

import os

FAULT_ENV = "PGLOGREPL_FAULT"
PAUSE_ENV = "PGLOGREPL_PAUSE"
PAUSE_LIMIT_S = 120.0


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


def pause(point: str) -> None:
    spec = os.environ.get(PAUSE_ENV)
    if not spec:
        return
    name, _, directory = spec.partition(":")
    if name != point or not directory:
        return
    import time
    from pathlib import Path

    folder = Path(directory)
    (folder / f"{point}.{os.getpid()}").touch()
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not (folder / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # waiting for the test's signal: the file is the condition polled
