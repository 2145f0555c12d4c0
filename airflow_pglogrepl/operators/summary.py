"""The cutover's closing report: what happened, and how long the application could not write.

A DBA reading a finished (or failed) cutover run wants one place that says whether the switch
happened, from which server version to which, at which fence LSN, whether parity held, and the
*write downtime*: from the moment the write fence took effect on the old primary to the moment
the new primary stood alone (subscription dropped, reverse replication in place). Both instants
are the worker's UTC clock, taken by ``WriteFenceOperator`` (``write_fence_at``) and
``FinalizeCutoverOperator`` (``switched_at``), so the figure does not depend on the two servers'
clocks agreeing. The summary runs whatever happened upstream (``trigger_rule="all_done"``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

SWITCHED = "switched"
ROLLED_BACK = "fenced, then rolled back (fence released, nothing dropped)"
NOT_FENCED = "stopped before the fence (the application never stopped writing)"


def summarize(
    *,
    fence: Mapping[str, Any] | None,
    finalize: Mapping[str, Any] | None,
    parity: Mapping[str, Any] | None = None,
    sequences: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report from the tasks' return values (any may be missing: the task did not finish)."""
    if fence is None:
        outcome = NOT_FENCED
    elif finalize is None or "switched_at" not in finalize:
        outcome = ROLLED_BACK
    else:
        outcome = SWITCHED
    fenced_at = _instant(fence, "write_fence_at")
    switched_at = _instant(finalize, "switched_at") if outcome == SWITCHED else None
    downtime = (
        round((switched_at - fenced_at).total_seconds(), 3)
        if fenced_at is not None and switched_at is not None
        else None
    )
    report: dict[str, Any] = {
        "outcome": outcome,
        "old_primary_version": (fence or {}).get("server_version"),
        "new_primary_version": (finalize or {}).get("server_version"),
        "fence_lsn": (fence or {}).get("fence_lsn"),
        "write_fence_at": fenced_at.isoformat() if fenced_at else None,
        "switched_at": switched_at.isoformat() if switched_at else None,
        "write_downtime_seconds": downtime,
        "fence_wait_seconds": (fence or {}).get("waited_seconds"),
        "parity_passed": None if parity is None else bool(parity.get("passed")),
        "tables_checked": None if parity is None else parity.get("checked"),
        "sequences_changed": None if sequences is None else sequences.get("changed"),
        "slot_left_behind": (finalize or {}).get("slot_left_behind"),
    }
    report["text"] = _text(report)
    return report


def _instant(result: Mapping[str, Any] | None, key: str) -> dt.datetime | None:
    value = (result or {}).get(key)
    return dt.datetime.fromisoformat(value) if isinstance(value, str) else None


def _text(report: Mapping[str, Any]) -> str:
    versions = ""
    if report["old_primary_version"] or report["new_primary_version"]:
        versions = (
            f"PostgreSQL {report['old_primary_version'] or '?'} -> "
            f"{report['new_primary_version'] or '?'}: "
        )
    lines = [f"Cutover {versions}{report['outcome']}"]
    if report["fence_lsn"]:
        lines.append(f"  fence LSN            {report['fence_lsn']}")
    if report["write_downtime_seconds"] is not None:
        lines.append(
            f"  write downtime       {report['write_downtime_seconds']:.1f} s "
            f"(fence {report['write_fence_at']} -> switch {report['switched_at']}, worker clock)"
        )
    if report["fence_wait_seconds"] is not None:
        lines.append(f"  of which fence wait  {report['fence_wait_seconds']:.1f} s")
    if report["parity_passed"] is not None:
        verdict = "equal" if report["parity_passed"] else "DIFFERENT"
        lines.append(f"  parity               {verdict} on {report['tables_checked']} tables")
    if report["sequences_changed"] is not None:
        lines.append(f"  sequences moved      {report['sequences_changed']}")
    if report["slot_left_behind"]:
        lines.append(
            f"  slot left behind     {report['slot_left_behind']} on the old primary: "
            f"SELECT pg_drop_replication_slot('{report['slot_left_behind']}')"
        )
    return "\n".join(lines)


class CutoverSummaryOperator(BaseOperator):
    """Report the cutover's outcome and write downtime from the other tasks' return values.

    Runs whatever happened upstream (``trigger_rule="all_done"`` unless given). Returns the
    report (keys: ``outcome``, ``old_primary_version``, ``new_primary_version``, ``fence_lsn``,
    ``write_fence_at``, ``switched_at``, ``write_downtime_seconds``, ``fence_wait_seconds``,
    ``parity_passed``, ``tables_checked``, ``sequences_changed``, ``slot_left_behind``, ``text``)
    and logs its text.

    As the DAG's last task it decides the run's state: unless the cutover switched, it fails
    after reporting (``fail_unless_switched``), so a rolled-back cutover is a failed run.

    :param fence_task_id: the ``WriteFenceOperator`` task.
    :param finalize_task_id: the ``FinalizeCutoverOperator`` task.
    :param parity_task_id: the ``TableParityCheckOperator`` task (optional).
    :param sequences_task_id: the ``SyncSequencesOperator`` task (optional).
    :param fail_unless_switched: fail (no retry) when the outcome is not ``switched``.
    """

    template_fields = ("fence_task_id", "finalize_task_id", "parity_task_id", "sequences_task_id")
    ui_color = "#e8f0e8"

    def __init__(
        self,
        *,
        fence_task_id: str = "write_fence",
        finalize_task_id: str = "finalize",
        parity_task_id: str | None = "parity_check",
        sequences_task_id: str | None = "sync_sequences",
        fail_unless_switched: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.fence_task_id = fence_task_id
        self.finalize_task_id = finalize_task_id
        self.parity_task_id = parity_task_id
        self.sequences_task_id = sequences_task_id
        self.fail_unless_switched = fail_unless_switched

    def execute(self, context: Context) -> dict[str, Any]:
        ti = context["ti"]

        def pulled(task_id: str | None) -> Mapping[str, Any] | None:
            value = ti.xcom_pull(task_ids=task_id) if task_id else None
            return value if isinstance(value, Mapping) else None

        report = summarize(
            fence=pulled(self.fence_task_id),
            finalize=pulled(self.finalize_task_id),
            parity=pulled(self.parity_task_id),
            sequences=pulled(self.sequences_task_id),
        )
        self.log.info("%s", report["text"])
        if self.fail_unless_switched and report["outcome"] != SWITCHED:
            from airflow.sdk.exceptions import AirflowFailException

            ti.xcom_push(key="return_value", value=report)
            raise AirflowFailException(
                f"the cutover did not switch: {report['outcome']}. The failed task before this "
                f"one says why; fix it and trigger the DAG again (every step is idempotent)"
            )
        return report
