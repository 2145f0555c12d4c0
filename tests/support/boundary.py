"""What a task raises when one of our errors that no retry can help reaches its boundary."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_pglogrepl.boundary import raised_error

E = TypeVar("E", bound=BaseException)


@dataclass
class Caught(Generic[E]):
    """The error of ours behind the task's failure (``value``), once the block has raised."""

    value: E = None  # type: ignore[assignment]


@contextmanager
def task_fails_with(error: type[E], match: str | None = None) -> Iterator[Caught[E]]:
    """The block (an operator's ``execute``, a sensor's ``poke``) fails the task at once:
    ``AirflowFailException`` with the message of an ``error`` it carries (``raised_error``)."""
    caught: Caught[E] = Caught()
    with pytest.raises(AirflowFailException) as info:
        yield caught
    cause = raised_error(info.value)
    assert isinstance(cause, error), f"the task failed because of {cause!r}, not {error.__name__}"
    assert str(info.value) == f"{type(cause).__name__}: {cause}"
    if match is not None:
        assert re.search(match, str(cause)), f"{match!r} not in {str(cause)!r}"
    caught.value = cause
