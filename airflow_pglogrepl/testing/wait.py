"""Poll a condition until it holds: the only way tests (and the demo) wait for a server."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeoutError(AssertionError):
    """The condition did not hold in time; the message says what was awaited and last seen."""


def wait_until(
    condition: Callable[[], T],
    *,
    what: str,
    timeout: float = 60.0,
    interval: float = 0.05,
) -> T:
    """Call ``condition`` until it returns something truthy; return that value.

    Polls with a short, growing interval (capped at 1 s) so fast conditions finish fast and slow
    ones do not hammer the server.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}"
            )
        time.sleep(interval)
        interval = min(interval * 1.5, 1.0)
