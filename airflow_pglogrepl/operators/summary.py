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

from airflow_pglogrepl.boundary import TaskBoundary

if TYPE_CHECKING:
    from airflow.sdk import Context

SWITCHED = "switched"
SWITCH_INCOMPLETE = (
    "switched, but finalize failed after dropping the subscription: the new primary stands "
    "alone and the old primary stays fenced"
)
ROLLED_BACK = "fenced, then rolled back (fence released, nothing dropped)"
FENCE_HELD = "fenced and stopped, and the fence is STILL IN PLACE on the old primary"
NOT_FENCED = "stopped before the fence (the application never stopped writing)"

# What to do after each outcome but a switch: a re-run is right only where nothing was dropped.
NEXT_STEP = {
    SWITCH_INCOMPLETE: "do NOT trigger the DAG again (it would create the subscription anew and "
    "copy the tables onto the new primary again). Finish by hand what the failed finalize "
    "reports (reverse replication, a slot left behind), then repoint the application",
    ROLLED_BACK: "the failed task before this one says why; fix it and trigger the DAG again "
    "(every step is idempotent)",
    FENCE_HELD: "the application cannot write to the old primary: release the fence "
    "(WriteFenceReleaseOperator, or clear the release_fence task) unless you mean to go on",
    NOT_FENCED: "the failed task before this one says why; fix it and trigger the DAG again "
    "(every step is idempotent)",
}


def summarize(
    *,
    fence_applied: Mapping[str, Any] | None,
    dropped: Mapping[str, Any] | None,
    finalize: Mapping[str, Any] | None,
    released: Mapping[str, Any] | None = None,
    fence: Mapping[str, Any] | None = None,
    parity: Mapping[str, Any] | None = None,
    sequences: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report from what the tasks pushed. ``fence_applied`` and ``dropped`` are the marks
    the fence and finalize push the moment they take effect, so a task that failed after its
    effect is still counted; the return values (any may be missing) fill in the rest."""
    if fence_applied is None:
        outcome = NOT_FENCED
    elif finalize is not None:
        outcome = SWITCHED
    elif dropped is not None:
        outcome = SWITCH_INCOMPLETE
    elif released is not None:
        outcome = ROLLED_BACK
    else:
        outcome = FENCE_HELD
    fenced_at = _instant(fence_applied, "write_fence_at")
    switched_at = _instant(finalize, "switched_at")
    downtime = (
        round((switched_at - fenced_at).total_seconds(), 3)
        if fenced_at is not None and switched_at is not None
        else None
    )
    report: dict[str, Any] = {
        "outcome": outcome,
        "next_step": NEXT_STEP.get(outcome),
        "old_primary_version": (fence_applied or {}).get("server_version"),
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
    elif report["outcome"] == SWITCHED:
        lines.append("  write downtime       unknown: finalize was retried after the drop")
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
    if report["next_step"]:
        lines.append(f"  next                 {report['next_step']}")
    return "\n".join(lines)


class CutoverSummaryOperator(TaskBoundary, BaseOperator):
    """Report the cutover's outcome and write downtime from what the other tasks pushed.

    Runs whatever happened upstream (``trigger_rule="all_done"`` unless given). Returns the
    report (keys: ``outcome``, ``next_step``, ``old_primary_version``, ``new_primary_version``,
    ``fence_lsn``, ``write_fence_at``, ``switched_at``, ``write_downtime_seconds``,
    ``fence_wait_seconds``, ``parity_passed``, ``tables_checked``, ``sequences_changed``,
    ``slot_left_behind``, ``text``) and logs its text. The outcome comes from the marks the fence
    and finalize push the moment they take effect, so a task that failed after its effect still
    counts: a finalize that failed after the drop is not taken for a run to trigger again.

    As the DAG's last task it decides the run's state: unless the cutover switched, it fails
    after reporting (``fail_unless_switched``), so a rolled-back cutover is a failed run.

    :param fence_task_id: the ``WriteFenceOperator`` task.
    :param finalize_task_id: the ``FinalizeCutoverOperator`` task.
    :param release_task_id: the ``WriteFenceReleaseOperator`` task of the rollback path.
    :param parity_task_id: the ``TableParityCheckOperator`` task (optional).
    :param sequences_task_id: the ``SyncSequencesOperator`` task (optional).
    :param fail_unless_switched: fail (no retry) when the outcome is not ``switched``.
    """

    template_fields = (
        "fence_task_id", "finalize_task_id", "release_task_id", "parity_task_id",
        "sequences_task_id",
    )  # fmt: skip
    ui_color = "#e8f0e8"

    def __init__(
        self,
        *,
        fence_task_id: str = "write_fence",
        finalize_task_id: str = "finalize",
        release_task_id: str | None = "release_fence",
        parity_task_id: str | None = "parity_check",
        sequences_task_id: str | None = "sync_sequences",
        fail_unless_switched: bool = True,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.fence_task_id = fence_task_id
        self.finalize_task_id = finalize_task_id
        self.release_task_id = release_task_id
        self.parity_task_id = parity_task_id
        self.sequences_task_id = sequences_task_id
        self.fail_unless_switched = fail_unless_switched

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pglogrepl.operators.fence import FENCE_APPLIED_KEY
        from airflow_pglogrepl.operators.finalize import DROPPED_KEY

        ti = context["ti"]

        def pulled(task_id: str | None, key: str = "return_value") -> Mapping[str, Any] | None:
            value = ti.xcom_pull(task_ids=task_id, key=key) if task_id else None
            return value if isinstance(value, Mapping) else None

        report = summarize(
            fence_applied=pulled(self.fence_task_id, FENCE_APPLIED_KEY),
            dropped=pulled(self.finalize_task_id, DROPPED_KEY),
            finalize=pulled(self.finalize_task_id),
            released=pulled(self.release_task_id),
            fence=pulled(self.fence_task_id),
            parity=pulled(self.parity_task_id),
            sequences=pulled(self.sequences_task_id),
        )
        self.log.info("%s", report["text"])
        if self.fail_unless_switched and report["outcome"] != SWITCHED:
            from airflow_pglogrepl.exceptions import CutoverNotSwitchedError

            ti.xcom_push(key="return_value", value=report)
            raise CutoverNotSwitchedError(report["outcome"], report["next_step"])
        return report
