"""The task boundary: the one place where this package's errors become Airflow's.

Hooks, the decoder and the lake raise the project's own errors (``exceptions/``), which carry
the object and the fix and know nothing of Airflow. Airflow retries a failed task unless it sees
``AirflowFailException``; most of our errors (a lost slot, a missing grant, a lake from another
server, a failed parity check) do not heal by retrying, and retries would only delay the page to
the person who must act, or hide the first message under later ones. So every operator and sensor
of the package inherits ``TaskBoundary``: an error whose class says it is not ``retryable`` fails
the task at once, with the same message; a retryable one (a busy slot, a lock, a network fault)
and any foreign exception reach Airflow unchanged, so its retry policy applies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from airflow_pglogrepl.exceptions import PgLogReplError

__all__ = ["BOUNDARY_METHODS", "TaskBoundary", "at_boundary", "raised_error", "task_failure"]

# The methods through which Airflow enters a task and leaves it with an error: the operator's
# work and the resumption after a deferral. A sensor's ``poke`` is not one: its errors go through
# the sensor's own loop first (``silent_fail`` keeps poking, ``soft_fail`` skips on
# ``AirflowFailException``), and leave through ``execute``.
BOUNDARY_METHODS = ("execute", "execute_complete")

F = TypeVar("F", bound=Callable[..., Any])


def task_failure(error: PgLogReplError) -> Exception:
    """What the task raises for ``error``: ``AirflowFailException`` when no retry can help, else
    ``error`` itself. The one translation of the package.

    The failure says what ``error`` says once, prefixed with its class, and carries its
    traceback and its cause (the server's or driver's own error): chaining ``error`` itself would
    print its message a second time in the task log. ``raised_error`` gives ``error`` back.
    """
    if error.retryable:
        return error
    from airflow.sdk.exceptions import AirflowFailException

    failure = AirflowFailException(f"{type(error).__name__}: {error}")
    failure.pglogrepl_error = error  # type: ignore[attr-defined]
    failure.__cause__ = _cause(error)
    failure.__suppress_context__ = True
    return failure.with_traceback(error.__traceback__)


def _cause(error: BaseException) -> BaseException | None:
    """What the traceback of ``error`` would print before it: its cause, else the error it was
    raised while handling (a cleanup that failed in turn), unless ``from None`` hid that."""
    if error.__cause__ is not None or error.__suppress_context__:
        return error.__cause__
    return error.__context__


def raised_error(failure: BaseException) -> PgLogReplError | None:
    """The package's error a task failed with: ``failure`` itself, or the error behind the
    ``AirflowFailException`` of ``task_failure``; None for anything else."""
    if isinstance(failure, PgLogReplError):
        return failure
    error = getattr(failure, "pglogrepl_error", None)
    return error if isinstance(error, PgLogReplError) else None


def at_boundary(method: F) -> F:
    """``method``, with a non-retryable ``PgLogReplError`` raised as ``AirflowFailException``."""
    if getattr(method, "__pglogrepl_boundary__", False):
        return method

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except PgLogReplError as exc:
            failure = task_failure(exc)
            if failure is exc:
                raise
            raise failure from failure.__cause__

    wrapper.__pglogrepl_boundary__ = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


class TaskBoundary:
    """Mixin of every operator and sensor here: the methods of ``BOUNDARY_METHODS`` a class
    defines itself are wrapped by ``at_boundary`` when the class is created, so no operator can
    forget to (tests/test_boundary.py checks each class of the package)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in BOUNDARY_METHODS:
            method = cls.__dict__.get(name)
            if callable(method):
                setattr(cls, name, at_boundary(method))
