"""What the replication sensors share: poke decides with a ``Verdict``; deferral polls the same.

A failed verdict fails the task at once (``GateFailedError``, which the task boundary turns into
``AirflowFailException``: no retries, no waiting for the timeout): replication that is broken
does not heal by waiting.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue, conf

from airflow_pglogrepl.boundary import TaskBoundary, task_failure
from airflow_pglogrepl.models.verdicts import Verdict


class VerdictSensor(TaskBoundary, BaseSensorOperator):
    """Base of the replication sensors; subclasses implement ``verdict()`` and ``trigger()``."""

    def __init__(
        self,
        *,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable

    def verdict(self) -> Verdict:
        raise NotImplementedError

    def trigger(self) -> Any:
        raise NotImplementedError

    def poke(self, context: Context) -> bool | PokeReturnValue:
        verdict = self.verdict()
        self.log.info("%s", verdict.message)
        context["ti"].xcom_push(key="observed", value=verdict.data)
        if verdict.failed:
            self._fail(verdict.message)
        if verdict.done:
            return PokeReturnValue(is_done=True, xcom_value=verdict.data)
        return False

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=self.trigger(),
            method_name="execute_complete",
            timeout=dt.timedelta(seconds=float(self.timeout)),
        )
        return None

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """Resume after the trigger fired: succeed with what it saw, or fail with its message."""
        data = event.get("data")
        if data is not None:
            context["ti"].xcom_push(key="observed", value=data)
        if event.get("status") == "success":
            self.log.info("%s", event.get("message"))
            return data
        # "error": the check itself failed (a network fault...), retryable as the error was
        self._fail(str(event.get("message")), retryable=bool(event.get("retryable", False)))

    def _fail(self, message: str, *, retryable: bool = False) -> None:
        from airflow_pglogrepl.exceptions import GateFailedError

        # Raised as AirflowFailException already inside poke, so that the sensor's own loop
        # sees a failed gate as Airflow's (soft_fail skips it, as for a timeout).
        raise task_failure(GateFailedError(message, retryable=retryable))
