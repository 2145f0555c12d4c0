"""Errors of replication objects and their checks: definitions, publications, subscriptions, the
cutover's gates and fence, privileges, the preflight and the Spark applications."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_pglogrepl.preflight.report import PreflightReport
    from airflow_pglogrepl.tables import TableRef

from airflow_pglogrepl.exceptions.base import PgLogReplError


class DefinitionConflictError(PgLogReplError):
    """An object exists with a definition this task cannot reconcile without destroying it."""

    def __init__(self, kind: str, name: str, difference: str, fix: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} {name!r} exists but {difference}. Fix: {fix}")


class ObjectNotFoundError(PgLogReplError):
    """A publication or subscription that the task needs does not exist."""

    def __init__(self, kind: str, name: str, fix: str) -> None:
        self.kind = kind
        self.name = name
        super().__init__(f"{kind} {name!r} does not exist. Fix: {fix}")


_LISTED = 20  # existing publications a PublicationNotFoundError names


class PublicationNotFoundError(ObjectNotFoundError):
    """Publications a drain, a snapshot or a peek reads do not exist (in the slot's database).

    ``existing``: the publications that database has, when looked up; the message lists them
    and suggests the closest to each missing name. ``server``: where it was looked (host, port,
    database). ``consequence``: what was (not) done; by default, nothing committed and the slot
    not moved, and on PostgreSQL 18 (``server_version``) why that matters."""

    def __init__(
        self,
        names: Sequence[str],
        slot: str | None = None,
        *,
        existing: Sequence[str] | None = None,
        server: str | None = None,
        server_version: int | None = None,
        consequence: str | None = None,
    ) -> None:
        import difflib

        self.kind = "publication"
        self.name = ", ".join(names)
        self.names = list(names)
        self.existing = None if existing is None else list(existing)
        self.slot = slot
        shown = ", ".join(repr(n) for n in names)
        what = (
            f"publication {shown} does not" if len(names) == 1 else f"publications {shown} do not"
        )
        if server:
            where = f" on {server}"
        elif slot:
            where = f" in the database of slot {slot!r}"
        else:
            where = ""
        found = ""
        if existing is not None:
            # a few: a database of one publication per tenant would fill every alert
            listed = ", ".join(repr(e) for e in existing[:_LISTED]) if existing else "none"
            if len(existing) > _LISTED:
                listed += f" and {len(existing) - _LISTED} more"
            found = f". The publications there: {listed}"
            guesses = [
                f"{close[0]!r} for {name!r}" if len(names) > 1 else repr(close[0])
                for name in names
                if (close := difflib.get_close_matches(name, existing, n=1, cutoff=0.6))
            ]
            if guesses:
                found += f"; did you mean {', '.join(guesses)}?"
        if consequence is None:
            consequence = "Nothing was committed and the slot did not move"
            if server_version is not None and server_version >= 180000:
                consequence += (
                    ": on PostgreSQL 18 a missing publication is only a warning, and every "
                    "window would come back empty while the slot advanced past the changes"
                )
        head = f"{what} exist{where}{found}"
        PgLogReplError.__init__(
            self,
            f"{head}{'' if head.endswith('?') else '.'} Fix: correct the publication name, or "
            f"create it there (CREATE PUBLICATION, or CreatePublicationOperator). {consequence}",
        )


class UnsupportedFeatureError(PgLogReplError):
    """The server version lacks a feature the task asks for."""


class ReplicationFailedError(PgLogReplError):
    """Replication is failing (table sync or apply errors) and will not heal by waiting."""


class GateFailedError(ReplicationFailedError):
    """A sensor's gate saw a state no wait can fix (a lost slot, a disabled subscription, a table
    whose sync failed); the message is the verdict's, with the object and the fix.
    ``retryable``: the check itself failed (a deferred sensor's trigger lost its connection)."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        self.retryable = retryable
        super().__init__(message)


class CheckFailedError(PgLogReplError):
    """A check task found problems; ``problems`` lists them, one line each, as the message does.

    The task's report (what was looked at, what differed) is in its XCom ``return_value``."""

    def __init__(self, heading: str, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(heading + ":\n- " + "\n- ".join(self.problems))


class SlotUnhealthyError(CheckFailedError):
    """A slot retains too much WAL, is lost or inactive too long, or cannot decode its
    transactions within ``temp_file_limit`` (``SlotHealthCheckOperator``)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("slot health check failed", problems)


class SubscriptionErrorsError(CheckFailedError):
    """A subscription has apply or sync errors, conflicts above their limit, or no running
    worker (``SubscriptionErrorCheckOperator``)."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("subscription errors", problems)


class ParityMismatchError(CheckFailedError):
    """Tables whose rows differ between publisher and subscriber (``TableParityCheckOperator``)."""

    def __init__(self, checked: int, problems: Sequence[str]) -> None:
        super().__init__(f"parity check failed for {len(problems)} of {checked} tables", problems)


class SequenceSyncError(CheckFailedError):
    """Sequences the sync could not set (``SyncSequencesOperator``); ``refused`` when it changed
    nothing because of them."""

    def __init__(self, problems: Sequence[str], *, refused: bool = False) -> None:
        heading = "refused, nothing was changed" if refused else "failed"
        super().__init__(f"sequence sync {heading}", problems)


class CutoverNotSwitchedError(PgLogReplError):
    """The cutover ended without switching writers to the new primary (``CutoverSummaryOperator``
    with ``fail_unless_switched``); the summary says where it stopped and what to do next."""

    def __init__(self, outcome: str, next_step: str) -> None:
        self.outcome = outcome
        super().__init__(f"the cutover did not switch: {outcome}. Next: {next_step}")


class PrivilegeError(PgLogReplError):
    """The connection's role lacks a privilege a step needs; nothing of the step was done."""

    def __init__(self, role: str, what: str, fix: str) -> None:
        self.role = role
        super().__init__(f"role {role!r} may not {what}. Nothing was done. Fix: {fix}")


class PasswordExposureError(PgLogReplError):
    """A statement carrying a password would be written to the server's log or statistics."""

    def __init__(self, kind: str, name: str, role: str, leaks: list[str]) -> None:
        self.leaks = leaks
        super().__init__(
            f"{kind} {name!r}: the statement carries the publisher's password, and as role "
            f"{role!r} this session cannot keep it out of the subscriber's server log and "
            f"statistics: {'; '.join(leaks)}. Nothing was sent. Fix: connect as a superuser, "
            f"or let the role set these parameters (PostgreSQL 15+: GRANT SET ON PARAMETER "
            f"<name> TO {role}), or change them for the server, or (superuser-owned "
            f"subscriptions only) leave the password out of the publisher connection and "
            f"put it in the subscriber server's passfile"
        )


class FenceNotHeldError(PgLogReplError):
    """The write fence would not stop every write: nothing was changed (the fence rolled back)."""


class FenceLockBusyError(FenceNotHeldError):
    """A lock on a fenced table kept the fence's guard from being changed within its wait;
    nothing was changed, and the same task run again can pass once that lock is gone."""

    retryable = True


class GuardHijackedError(FenceNotHeldError):
    """The write guard's schema belongs to a role the fencing role does not trust."""


class SparkSetupError(PgLogReplError):
    """The Spark application cannot run where it was sent (executors without the package...)."""


class SparkApplicationError(PgLogReplError):
    """A Spark application of this package (the drain, the snapshot) failed with ``error``, one of
    the errors here or a foreign one: the operator raises it again on its side of spark-submit,
    retryable as the original is (a foreign error is taken as retryable: a crash, a lost executor).
    """

    def __init__(self, error: str, message: str, *, retryable: bool) -> None:
        self.error = error
        self.retryable = retryable
        super().__init__(f"the Spark application failed with {error}: {message}")


class SubscriptionStatementError(PgLogReplError):
    """A statement on a subscription failed; the message has the server's error, without the
    publisher's password. ``retryable`` when the cause passes by itself (the publisher
    unreachable or out of WAL senders, a lock, a lost session)."""


class PreflightFailedError(PgLogReplError):
    """Something blocks replication; the message is the report's summary (every problem)."""

    def __init__(
        self, report: PreflightReport, *, warnings_fail: bool = False, retryable: bool = False
    ) -> None:
        self.report = report
        # True when every problem is on a table whose fix only a lock held up
        self.retryable = retryable
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
