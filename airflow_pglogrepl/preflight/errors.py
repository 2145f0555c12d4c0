"""Errors of the preflight: the check failed, or a replica identity could not be changed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_pglogrepl.exceptions import PgLogReplError

if TYPE_CHECKING:
    from airflow_pglogrepl.preflight.report import PreflightReport
    from airflow_pglogrepl.tables import TableRef


class PreflightFailedError(PgLogReplError):
    """Something blocks replication; the message is the report's summary (every problem)."""

    def __init__(self, report: PreflightReport, *, warnings_fail: bool = False) -> None:
        self.report = report
        lead = "" if report.problems or not warnings_fail else "Warnings fail this check "
        lead = lead and lead + "(fail_on_warnings=True).\n"
        super().__init__(lead + report.summary())


class ReplicaIdentityChangeError(PgLogReplError):
    """``ALTER TABLE ... REPLICA IDENTITY`` was refused (ownership, lock timeout, bad index)."""

    def __init__(self, table: TableRef, statement: str, reason: str, fix: str) -> None:
        self.table = table
        self.statement = statement
        self.reason = reason
        self.fix = fix
        super().__init__(f"{statement} failed: {reason}. Fix: {fix}")
