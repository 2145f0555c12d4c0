"""Which reader a run with ``reader="auto"`` uses for what is left of its backlog.

The two readers cost differently (docs/benchmarks.md, "Decode and drain"):

- a **peek** decodes from the slot's ``restart_lsn`` every time, and the server materializes its
  result before sending it; the result comes in big chunks, so nothing is paid per message;
- the **stream** decodes from ``restart_lsn`` once, but the walsender sends every message as a
  CopyData message of its own and tries to flush it: about 1.4 µs a message on this machine, which
  on small messages costs about 1.6 times the decode itself.

So for an ordinary backlog the peek is faster, and the stream wins only when every further peek
would decode a long stretch again: when something (a transaction left open, one bigger than a
window still being written) holds ``restart_lsn`` far behind where the run reads. The choice is
made before each peek from the slot's own figures, so a run that starts with peeks moves to the
stream once the pin grows (an open transaction pins more with every window the run moves past).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["STREAM_COST", "ReaderChoice", "peek_or_stream"]

# What the stream costs on top of a peek, per byte of WAL read, in bytes of decode: the
# walsender's per-message sending measured against the server's decode of the same WAL
# (bench_drain: 3.13 s stream against 1.90 s peek, server decode 0.78 s; bench_pinned gives the
# same crossing). Messages bigger than this workload's (under 100 bytes) make the stream cheaper,
# so the figure errs on the peek's side.
STREAM_COST = 1.6


@dataclass(frozen=True)
class ReaderChoice:
    """The reader for the rest of the run, and why (the task log and the summary say it)."""

    reader: str  # "peek" or "stream"
    why: str


def peek_or_stream(*, pinned: int, remaining: int, span: int) -> ReaderChoice:
    """The cheaper reader for ``remaining`` bytes of WAL read ``span`` bytes per peek, with the
    slot's ``restart_lsn`` ``pinned`` bytes behind where the run reads.

    Both readers decode the pinned stretch once; each further peek decodes it again. The stream
    pays ``STREAM_COST`` per byte it reads instead. The pin is taken as it is now: if it holds,
    it grows, and the next choice sees that.
    """
    if span <= 0:
        raise ValueError("span must be positive")
    pinned, remaining = max(0, pinned), max(0, remaining)
    peeks = max(1, math.ceil(remaining / span))
    again = (peeks - 1) * pinned  # what the peeks would decode more than the stream
    extra = STREAM_COST * remaining  # what the stream would pay more than the peeks
    if peeks > 1 and again > extra:
        return ReaderChoice("stream", (
            f"restart_lsn is {_size(pinned)} behind the slot's position (decoding restarts "
            f"there: a transaction still open holds it back, or WAL written faster than the "
            f"server records its running transactions): {peeks} more peeks would decode that "
            f"again each time, so the stream reads the remaining {_size(remaining)}"
        ))  # fmt: skip
    return ReaderChoice("peek", (
        f"a backlog of {_size(remaining)} with restart_lsn {_size(pinned)} behind: "
        f"peeks decode it faster than the stream sends it"
    ))  # fmt: skip


def _size(n: int) -> str:
    """``n`` bytes for a log line."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
