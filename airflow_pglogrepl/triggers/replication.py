"""Triggers for the deferrable sensors: poll with async psycopg, decide with the same rules.

Events carry ``status``: ``success`` (condition holds; ``data`` has what was seen), ``failed``
(it never will without a human; ``message`` says why) or ``error`` (the check itself broke).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_pglogrepl.models.verdicts import Verdict
from airflow_pglogrepl.triggers.probes import ProgressProbe, ReadyProbe, WorkerlessClock

SUCCESS, FAILED, ERROR = "success", "failed", "error"


class _PollingTrigger(BaseTrigger):
    """Poll ``check()`` every ``poll_interval`` seconds until it is done or failed."""

    def __init__(self, *, poll_interval: float, **probe: Any) -> None:
        super().__init__()
        self.poll_interval = poll_interval
        self.probe_kwargs = probe

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"poll_interval": self.poll_interval, **self.probe_kwargs},
        )

    async def check(self) -> Verdict:
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                verdict = await self.check()
            except Exception as exc:  # reported to the task, which fails with this message
                yield TriggerEvent(
                    {
                        "status": ERROR,
                        "message": f"{type(exc).__name__}: {exc}",
                        # as the same error in poke mode: a network fault retries
                        "retryable": bool(getattr(exc, "retryable", True)),
                    }
                )
                return
            if verdict.failed:
                yield TriggerEvent(
                    {"status": FAILED, "message": verdict.message, "data": verdict.data}
                )
                return
            if verdict.done:
                yield TriggerEvent(
                    {"status": SUCCESS, "message": verdict.message, "data": verdict.data}
                )
                return
            self.log.info("%s", verdict.message)
            await asyncio.sleep(self.poll_interval)


class SubscriptionReadyTrigger(_PollingTrigger):
    """Deferred ``SubscriptionReadySensor``: every table of the subscription in state ``r``."""

    def __init__(self, *, poll_interval: float, **probe: Any) -> None:
        super().__init__(poll_interval=poll_interval, **probe)
        self.probe = ReadyProbe(**probe)
        self._workerless = WorkerlessClock()

    async def check(self) -> Verdict:
        status = await self.probe.afetch()
        return self.probe.verdict(status, self._workerless.observe(status))


class ReplicationProgressTrigger(_PollingTrigger):
    """Deferred lag and catch-up sensors: slot lag bytes and/or an LSN target."""

    def __init__(self, *, poll_interval: float, **probe: Any) -> None:
        super().__init__(poll_interval=poll_interval, **probe)
        self.probe = ProgressProbe(**probe)

    async def check(self) -> Verdict:
        slot, status = await self.probe.afetch()
        return self.probe.verdict(slot, status)
