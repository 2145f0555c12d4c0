"""The object store of a lake, from an Airflow connection (``lake_conn_id`` of the operators).

The Amazon provider's ``aws`` connection is the one to use (it need not be installed: only the
connection's fields are read): login and password are the access key id and secret, or the
extra's ``aws_access_key_id``/``aws_secret_access_key``; the extra's ``endpoint_url`` (or
``service_config.s3.endpoint_url``, or the connection's host) names an S3-compatible server;
``region_name`` and ``aws_session_token`` as the Amazon provider reads them. No connection: each
engine's own defaults (``AWS_*`` variables, the instance's role).

The store is resolved in the task, never in the DAG file, and its secrets are masked in the task
log as soon as they are read.
"""

from __future__ import annotations

import os
import re
from typing import Any

from airflow_pglogrepl.exceptions import LakeLocationError, LakeStoreUnreachableError
from airflow_pglogrepl.lake.storage import S3_SCHEMES, ObjectStore, is_object_store

__all__ = ["LakeLocationError", "check_bucket", "check_lake_uri", "lake_store", "store_of"]


# What an object-store lake URI may hold: delta-rs decodes a URL's %-escapes where pyarrow keeps
# them, and cuts a query or a fragment off where pyarrow keeps it in the key, so anything else
# would put one lake's commits and files under different keys.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_KEY = re.compile(r"[A-Za-z0-9._/-]*")
# How long the look at the bucket before a run waits for an answer (per attempt, two attempts):
# a store that drops packets would otherwise hold the task for minutes before it says so
LOOK_TIMEOUT_S = 10.0
_REFUSED_FIELDS = ("role_arn", "profile_name", "assume_role_method", "aws_iam_role")


def check_lake_uri(lake_root: str) -> None:
    """Refuse a lake URI that carries credentials, or that the engines would not all read as
    the same keys of the same bucket. Errors never repeat the URI: it may hold a secret."""
    scheme, sep, rest = lake_root.partition("://")
    if not sep:
        if lake_root != lake_root.strip() or "\n" in lake_root:
            raise LakeLocationError("the lake path has leading or trailing blanks or a newline")
        named = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", lake_root)
        if named and named.group(1).lower() in (*S3_SCHEMES, "file", "gs", "abfss", "abfs"):
            raise LakeLocationError(
                f"the lake URI's scheme {named.group(1)}: is not followed by //. Fix: write "
                f"the lake as s3://bucket/prefix (or a plain path)"
            )
        return  # a local path
    if scheme == "file":
        if "?" in rest or "#" in rest:
            raise LakeLocationError(
                "the lake's file: URI has a query or a fragment, which no engine reads as part "
                "of the path. Fix: give the plain path"
            )
        return
    if scheme.lower() in S3_SCHEMES and scheme not in S3_SCHEMES:
        raise LakeLocationError(f"the lake URI's scheme must be written s3:// (or s3a://), in "
                                f"lower case, not {scheme}://")  # fmt: skip
    if scheme not in S3_SCHEMES:
        shown = scheme if re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme) else "another scheme"
        raise LakeLocationError(
            f"the lake URI is on {shown}://, which the lake does not reach: a local path or "
            f"file: URI, or s3:// (s3a://) on S3 or an S3-compatible store. "
            f"docs/object-storage.md says which settings carry over to ABFS and GCS"
        )
    bucket, _, key = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        raise LakeLocationError(
            "the lake URI holds credentials before its bucket: they would be shown in XCom, "
            "Asset events and the task log. Fix: put them in an Airflow connection of type aws, "
            "name it as lake_conn_id, and give the lake as s3://bucket/prefix"
        )
    if not _BUCKET.fullmatch(bucket):
        raise LakeLocationError(
            "the lake URI's bucket is not a bucket name (3 to 63 lower-case letters, digits, "
            "dots and hyphens). Fix: give the lake as s3://bucket/prefix"
        )
    if key.startswith("/") or any(part in ("", ".", "..") for part in key.rstrip("/").split("/")
                                  if key):  # fmt: skip
        raise LakeLocationError(
            f"the lake URI's prefix in bucket {bucket!r} has an empty, '.' or '..' part: "
            f"delta-rs resolves them and pyarrow does not, so the engines would read different "
            f"keys. Fix: give the prefix as plain names separated by single slashes"
        )
    if not _KEY.fullmatch(key):
        raise LakeLocationError(
            f"the lake URI's prefix in bucket {bucket!r} holds characters other than letters, "
            f"digits, '.', '_', '-' and '/' (a space, '%', '?', '#' or ';' is read differently "
            f"by delta-rs and by pyarrow, and a query may carry a secret). Fix: name the "
            f"prefix with those characters only"
        )


def lake_store(conn_id: str | None, lake_root: str) -> ObjectStore | None:
    """The object store of the lake at ``lake_root`` (None: a local lake), its secrets masked."""
    check_lake_uri(lake_root)
    if not is_object_store(lake_root):
        if conn_id:
            raise LakeLocationError(
                f"lake_conn_id {conn_id!r} is given but the lake is a local path. "
                f"Fix: give the lake's s3:// URI as lake=, or leave lake_conn_id out"
            )
        return None
    if not conn_id:  # the engines' own credentials, but one endpoint and region for them all
        return store_of(None, None, None, {})
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    store = store_of(conn.login, conn.password, conn.host, conn.extra_dejson)
    _mask(store)
    return store


def store_of(login: str | None, password: str | None, host: str | None,
             extra: dict[str, Any]) -> ObjectStore:  # fmt: skip
    """The store an ``aws`` connection's fields describe. An endpoint or region the connection
    leaves out is the worker's ``AWS_ENDPOINT_URL``/``AWS_REGION``, given to every engine
    explicitly: otherwise delta-rs would follow those variables and pyarrow and Spark not, and
    one lake's commits and files would go to different stores."""
    refused = [f for f in _REFUSED_FIELDS if extra.get(f)]
    if refused:
        raise LakeLocationError(
            f"the lake's connection sets {', '.join(refused)}, which the lake does not use: "
            f"it would reach the store as someone else than the connection says. Fix: give "
            f"the keys in the connection, or no connection and the worker's own role"
        )
    service = (extra.get("service_config") or {}).get("s3") or {}
    endpoint = extra.get("endpoint_url") or service.get("endpoint_url") or host or None
    endpoint = (
        endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    )
    if endpoint and "://" not in endpoint:
        endpoint = f"https://{endpoint}"
    region = (
        extra.get("region_name")
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )
    return ObjectStore(
        endpoint_url=endpoint or None,
        region=region or None,
        access_key_id=login or extra.get("aws_access_key_id") or None,
        secret_access_key=password or extra.get("aws_secret_access_key") or None,
        session_token=extra.get("aws_session_token") or None,
    )


def _mask(store: ObjectStore) -> None:
    from airflow_pglogrepl.hooks.base import mask  # psycopg: only when the task runs

    for secret in store.secrets():
        mask(secret)


def check_bucket(store: ObjectStore, lake_root: str, *, timeout_s: float = LOOK_TIMEOUT_S) -> None:
    """Look at the lake once before anything starts: a bucket that does not exist, keys the
    store refuses, an endpoint that does not answer are named here, with the fix, rather than in
    delta-rs' own words from the middle of a run. The lake's prefix is looked at first (keys
    allowed only under it are enough for the lake); the bucket only when the prefix is empty,
    to tell a new lake from a bucket that is not there."""
    from pyarrow import fs

    bucket, _, prefix = lake_root.partition("://")[2].partition("/")
    where = store.endpoint_url or "AWS S3" + (f" ({store.region})" if store.region else "")
    system = store.arrow_filesystem(timeout_s=timeout_s)
    try:
        if system.get_file_info(f"{bucket}/{prefix}".rstrip("/")).type != fs.FileType.NotFound:
            return
        try:
            found = system.get_file_info(bucket)
        except OSError as exc:
            if _denied(exc):  # keys for the lake's prefix only: the bucket is not theirs to see
                return
            raise
    except OSError as exc:
        raise _look_failed(exc, bucket, where) from None
    if found.type == fs.FileType.NotFound:
        raise LakeLocationError(
            f"the lake's bucket {bucket!r} does not exist at {where}. Nothing was started. "
            f"Fix: create the bucket, or correct the lake's URI (the lake does not create buckets)"
        )


def _denied(exc: OSError) -> bool:
    return any(s in str(exc) for s in ("ACCESS_DENIED", "AccessDenied", "403"))


def _look_failed(exc: OSError, bucket: str, where: str) -> Exception:
    """The error of a look that failed: keys the store refuses and a bucket in another region
    need a person (not retried); a store that did not answer may answer the next try."""
    text = str(exc)
    if _denied(exc):
        return LakeLocationError(
            f"the store at {where} refused the lake's keys for bucket {bucket!r} ({text}). "
            f"Nothing was started. Fix: give the lake's connection keys allowed to list and "
            f"write the lake's prefix"
        )
    if (
        "PermanentRedirect" in text
        or "AuthorizationHeaderMalformed" in text
        or re.search(
            r"(?<![\d.:])301(?!\d)",
            text,  # an HTTP status, not a digit run of a port or address
        )
    ):
        return LakeLocationError(
            f"bucket {bucket!r} is in another region than {where} ({text}). Nothing was "
            f"started. Fix: set region_name in the lake's connection to the bucket's region"
        )
    return LakeStoreUnreachableError(
        f"the lake's bucket {bucket!r} at {where} could not be looked at: {text}. Nothing was "
        f"started. Fix: check that the endpoint answers from this worker"
    )
