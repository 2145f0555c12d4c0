"""The project's error tree: every failure names the object involved and the fix.

Callers catch the specific class (``SlotNotFoundError``, ``SlotInUseError`` ...), never a bare
``Exception``. Nothing here imports Airflow or psycopg, so the pure parts of the package (the LSN
type, the decoder) can raise these inside Spark executors too.

Each class says whether running the task again unchanged can succeed (``retryable``). Most cannot:
a lost slot, a missing grant or a lake from another server wait for a person. The task boundary
(``airflow_pglogrepl.boundary``) is the one place that turns those into Airflow's
``AirflowFailException``, so a task fails at once instead of spending its retries.

The tree is split by what fails, one module each: ``base``, ``source`` (the connection, the
server, slots, decoding), ``objects`` (definitions, publications, subscriptions, checks, the
cutover's fence, the Spark applications), ``snapshot`` (the snapshot's reads) and ``lake``. Every
class is importable from here, where callers import it.
"""

from __future__ import annotations

from airflow_pglogrepl._moved import renamed
from airflow_pglogrepl.exceptions.base import (
    PgLogReplError,
)
from airflow_pglogrepl.exceptions.lake import (
    OLD_NAMES,
    ColumnBackfillError,
    IncompatibleSchemaChangeError,
    LakeCommitConflictError,
    LakeError,
    LakeFromAnotherSourceError,
    LakeLocationError,
    LakeMismatchError,
    LakeNotEmptyError,
    LakeNotSnapshottedError,
    LakeOfAnotherSlotError,
    LakeSnapshotUnfinishedError,
    LakeStoreUnreachableError,
    LakeWriterBusyError,
    QuarantinedTablesError,
    ReplayRangeError,
    SchemaChangedError,
    SlotAheadOfLakeError,
    SnapshotNotCommittedError,
    TableNotInLakeError,
    UnsafeRetentionError,
    UnstorableValueError,
    UnsupportedColumnTypeError,
    WriterLockLostError,
)
from airflow_pglogrepl.exceptions.objects import (
    CheckFailedError,
    CutoverNotSwitchedError,
    DefinitionConflictError,
    FenceLockBusyError,
    FenceNotHeldError,
    GateFailedError,
    GuardHijackedError,
    ObjectNotFoundError,
    ParityMismatchError,
    PasswordExposureError,
    PreflightFailedError,
    PrivilegeError,
    PublicationNotFoundError,
    ReplicaIdentityChangeError,
    ReplicationFailedError,
    SequenceSyncError,
    SlotUnhealthyError,
    SparkApplicationError,
    SparkSetupError,
    SubscriptionErrorsError,
    SubscriptionStatementError,
    UnsupportedFeatureError,
)
from airflow_pglogrepl.exceptions.snapshot import (
    ArrowPeekError,
    CatalogChangedError,
    SnapshotLockError,
    SnapshotReadError,
    TableRewrittenError,
)
from airflow_pglogrepl.exceptions.source import (
    INVALIDATION_CAUSES,
    ConnectionFailedError,
    DecodeError,
    InvalidLSNError,
    InvalidSlotNameError,
    PublisherNotConfiguredError,
    ServerNotConfiguredError,
    SlotAdvanceError,
    SlotAlreadyExistsError,
    SlotError,
    SlotInUseError,
    SlotLostError,
    SlotNotFoundError,
    SlotStreamError,
    SlotStreamUnavailableError,
    StreamProtocolError,
    UnknownRelationError,
    WrongPluginError,
    lost_slot_message,
)

__all__ = [
    "INVALIDATION_CAUSES",
    "ArrowPeekError",
    "CatalogChangedError",
    "CheckFailedError",
    "ColumnBackfillError",
    "ConnectionFailedError",
    "CutoverNotSwitchedError",
    "DecodeError",
    "DefinitionConflictError",
    "FenceLockBusyError",
    "FenceNotHeldError",
    "GateFailedError",
    "GuardHijackedError",
    "IncompatibleSchemaChangeError",
    "InvalidLSNError",
    "InvalidSlotNameError",
    "LakeCommitConflictError",
    "LakeError",
    "LakeFromAnotherSourceError",
    "LakeLocationError",
    "LakeMismatchError",
    "LakeNotEmptyError",
    "LakeNotSnapshottedError",
    "LakeOfAnotherSlotError",
    "LakeSnapshotUnfinishedError",
    "LakeStoreUnreachableError",
    "LakeWriterBusyError",
    "ObjectNotFoundError",
    "ParityMismatchError",
    "PasswordExposureError",
    "PgLogReplError",
    "PreflightFailedError",
    "PrivilegeError",
    "PublicationNotFoundError",
    "PublisherNotConfiguredError",
    "QuarantinedTablesError",
    "ReplayRangeError",
    "ReplicaIdentityChangeError",
    "ReplicationFailedError",
    "SchemaChangedError",
    "SequenceSyncError",
    "ServerNotConfiguredError",
    "SlotAdvanceError",
    "SlotAheadOfLakeError",
    "SlotAlreadyExistsError",
    "SlotError",
    "SlotInUseError",
    "SlotLostError",
    "SlotNotFoundError",
    "SlotStreamError",
    "SlotStreamUnavailableError",
    "SlotUnhealthyError",
    "SnapshotLockError",
    "SnapshotNotCommittedError",
    "SnapshotReadError",
    "SparkApplicationError",
    "SparkSetupError",
    "StreamProtocolError",
    "SubscriptionErrorsError",
    "SubscriptionStatementError",
    "TableNotInLakeError",
    "TableRewrittenError",
    "UnknownRelationError",
    "UnsafeRetentionError",
    "UnstorableValueError",
    "UnsupportedColumnTypeError",
    "UnsupportedFeatureError",
    "WriterLockLostError",
    "WrongPluginError",
    "lost_slot_message",
]


# The lake was once also called the sink; the old names still reach the same classes.
__getattr__ = renamed(__name__, OLD_NAMES)
