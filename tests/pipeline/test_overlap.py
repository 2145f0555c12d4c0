"""The drain's overlapped stages (``pipeline.overlap``): order, failures, and early stops."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from airflow_pglogrepl.exceptions import ArrowPeekError
from airflow_pglogrepl.pipeline.overlap import Behind, prefetched


def test_prefetched_keeps_order_and_runs_the_producer_in_one_other_thread() -> None:
    threads: set[int] = set()

    def produce() -> Iterator[int]:
        for i in range(100):
            threads.add(threading.get_ident())
            yield i

    assert list(prefetched(produce(), depth=2)) == list(range(100))
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_prefetched_raises_the_producers_error_as_itself_after_the_items_before_it() -> None:
    def produce() -> Iterator[int]:
        yield 1
        yield 2
        raise ArrowPeekError("the fetch failed")

    got = []
    with pytest.raises(ArrowPeekError, match="the fetch failed"):
        for item in prefetched(produce()):
            got.append(item)
    assert got == [1, 2]


def test_a_consumer_that_stops_early_closes_the_producer_in_its_thread() -> None:
    closed = threading.Event()
    produced = []

    def produce() -> Iterator[int]:
        try:
            for i in range(1_000_000):
                produced.append(i)
                yield i
        finally:
            closed.set()

    items = prefetched(produce(), depth=2)
    assert next(items) == 0
    items.close()  # what the drain does when the decoder raises
    assert closed.is_set()
    assert len(produced) <= 5  # it ran at most ``depth`` (and the one in hand) ahead


def test_behind_runs_calls_in_order_and_finish_waits_for_all() -> None:
    seen: list[int] = []
    behind = Behind(depth=2)
    for i in range(50):
        behind.submit(seen.append, i)
    behind.finish()
    assert seen == list(range(50))


def test_behind_raises_a_failure_as_itself_and_runs_nothing_after_it() -> None:
    seen: list[int] = []
    gate = threading.Event()

    def call(i: int) -> None:
        gate.wait(5)
        if i == 1:
            raise ValueError("column 'x' cannot be stored")
        seen.append(i)

    behind = Behind(depth=3)
    behind.submit(call, 0)
    behind.submit(call, 1)
    behind.submit(call, 2)  # queued behind the failing call
    gate.set()
    with pytest.raises(ValueError, match="cannot be stored"):
        behind.finish()
    assert seen == [0]
