"""Log entries put on an object store only where none is: S3's conditional create.

A Delta commit is the creation of the log entry of the next version, and it is atomic only if
the store refuses to create an object that exists. delta-rs sends its PUTs with
``If-None-Match: *``; the entries the lake writes itself (a column-mapped table's schema
change, a new table, a snapshot's publish) go through ``put_if_absent`` here: the same request,
through the Rust ``object_store`` crate delta-rs is built on (``obstore``). A writer that
stalled after it chose a version can never overwrite the entry another writer committed
meanwhile: the store answers 412 and the late writer stops, nothing of its commit made.

A store that ignores the condition would let both writers win. ``require_conditional_create``
finds that out before the first write of a process (two creates of one probe object: the
second must be refused) and refuses such a store as a lake, naming what it needs.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from airflow_pglogrepl.exceptions import LakeLocationError, LakeStoreUnreachableError
from airflow_pglogrepl.lake import storage

if TYPE_CHECKING:
    from airflow_pglogrepl.lake.storage import ObjectStore

__all__ = ["put_if_absent", "require_conditional_create"]

# The buckets (with their store's endpoint) whose store was seen to refuse a second create
_checked: set[tuple[str | None, str]] = set()
_checking = threading.Lock()
_PROBE = "_pglogrepl_create_probe"
# A conflict with no object behind it: another create of the key in flight; tried again so often
CONFLICT_TRIES = 4
CONFLICT_PAUSE_S = 0.1
# What an S3 error says, without what else it says (the text may repeat a session token)
_STATUS = re.compile(r"status code: (\d{3})")
_CODE = re.compile(r"<Code>([A-Za-z]{1,64})</Code>")


def put_if_absent(uri: str, data: bytes) -> bool:
    """Create the object at ``uri`` (``s3://bucket/key``) holding ``data``, only if no object
    is there; False (nothing written) when one is.

    A create the store answered with a conflict may be our own request's retry (the first
    attempt landed, its answer was lost): the object is then read back, and an object that
    holds exactly ``data`` is ours (every caller's entry carries an id of its own). A conflict
    with no object behind it is another create of the same key still in flight (S3's 409
    ConditionalRequestConflict): tried again, a few times, then taken for the other's.

    :raises LakeLocationError: the store refused the request (keys, permissions, region).
    :raises LakeStoreUnreachableError: it did not answer, or failed (5xx): whether an entry
        landed is what the next run finds (it reads the log before writing).
    """
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    bucket, key = _split(uri)
    store = _client(bucket)
    require_conditional_create(_root_of(uri))
    for attempt in range(CONFLICT_TRIES):
        try:
            store_put(store, key, data)
            return True
        except (AlreadyExistsError, PreconditionError):
            found = _read(store, bucket, key)
            if found is not None:
                return found == data
        except Exception as exc:  # obstore's own classes, and Python's for a missing bucket
            raise store_error(exc, bucket, f"the commit of {key}") from None
        time.sleep(CONFLICT_PAUSE_S * (attempt + 1))  # the other create lands or fails meanwhile
    return False


def store_put(store: Any, key: str, data: bytes) -> None:
    """One create-only PUT (``If-None-Match: *``): the single request a commit makes."""
    import obstore

    obstore.put(store, key, data, mode="create")


def require_conditional_create(uri: str) -> None:
    """Refuse the store of ``uri`` as a lake's unless it refuses to create an object twice;
    checked once per bucket and process (``LakeLocationError`` names what it needs). A local
    lake needs nothing: its entries are created by a hard link (``durability.put_commit``)."""
    if not storage.is_object_store(uri):
        return
    bucket, key = _split(uri)
    current = storage.current()
    seen = (None if current is None else current.endpoint_url, bucket)
    if seen in _checked:
        return
    with _checking:
        if seen in _checked:
            return
        _probe(_client(bucket), bucket, key)
        _checked.add(seen)


def store_error(exc: Exception, bucket: str, action: str) -> Exception:
    """The lake's error for a store's failed answer to ``action``: what the store said (its HTTP
    status and S3 error code, never its text: an S3 error may repeat the session token) and the
    fix. Refusals (3xx: another region, 4xx) are the lake's location's fault; the rest may
    pass, so retryable."""
    text = str(exc)
    status_found = _STATUS.search(text)
    code_found = _CODE.search(text)
    status = int(status_found.group(1)) if status_found else None
    said = " ".join(p for p in (status_found and status_found.group(1),
                                code_found and code_found.group(1)) if p)  # fmt: skip
    said = said or type(exc).__name__
    if "redirect" in text.lower() and status is None:
        status, said = 301, "a redirect: the bucket is in another region"
    if (isinstance(exc, FileNotFoundError) and status is None) or "NoSuchBucket" in said:
        return LakeLocationError(
            f"the object store has no bucket {bucket!r} (or the lake's keys may not see it): "
            f"{action} failed. Fix: create the bucket, or correct the lake's URI"
        )
    if status is not None and 300 <= status < 500 and status not in (408, 429):
        return LakeLocationError(
            f"the object store of bucket {bucket!r} refused {action} ({said}). Fix: check the "
            f"lake's keys and their permissions on the bucket, the session token's expiry and "
            f"the store's region"
        )
    return LakeStoreUnreachableError(
        f"the object store of bucket {bucket!r} did not complete {action} ({said}); the next "
        f"run reads the lake as the store holds it. Fix: check the store's endpoint and health, "
        f"then run again"
    )


def _probe(store: Any, bucket: str, key: str) -> None:
    from obstore.exceptions import (
        AlreadyExistsError,
        NotSupportedError,
        PreconditionError,
    )

    probe = f"{key.rstrip('/')}/{_PROBE}-{uuid.uuid4().hex}".lstrip("/")
    needs = (
        f"the object store of bucket {bucket!r} cannot hold a lake: a Delta commit must be "
        f"a create that fails where the log entry exists (If-None-Match: *), or two writers "
        f"could both commit one version and one's rows be lost. Fix: a store that supports "
        f"conditional writes (Amazon S3, MinIO, Ceph RGW and Cloudflare R2 do; "
        f"docs/object-storage.md lists what each needs); a locking provider such as "
        f"delta-rs's DynamoDB lock does not cover the commits this lake writes itself"
    )
    created = False
    try:
        store_put(store, probe, b"first")
        created = True
        try:
            store_put(store, probe, b"second")
        except (AlreadyExistsError, PreconditionError):
            return
        raise LakeLocationError(f"{needs} (it let a second create overwrite the first)")
    except NotSupportedError:
        raise LakeLocationError(f"{needs} (it does not support them)") from None
    except LakeLocationError:
        raise
    except Exception as exc:  # obstore's own classes, and Python's for a missing bucket
        status = _STATUS.search(str(exc))
        if status is not None and status.group(1) == "501":
            raise LakeLocationError(f"{needs} (it answered 501 Not Implemented)") from None
        raise store_error(exc, bucket, "the create of a probe object") from None
    finally:
        if created:
            _delete(store, probe)


def _delete(store: Any, key: str) -> None:
    import obstore

    with contextlib.suppress(Exception):  # a probe object left behind is harmless
        obstore.delete(store, key)


def _read(store: Any, bucket: str, key: str) -> bytes | None:
    """The object at ``key`` (None: there is none)."""
    import obstore

    try:
        return bytes(obstore.get(store, key).bytes())
    except FileNotFoundError:
        return None
    except Exception as exc:  # obstore's own classes
        raise store_error(exc, bucket, f"the read of {key}") from None


def _root_of(uri: str) -> str:
    """Where a table's entry is probed: its lake's root (``<root>/<folder>/<table>``), so a
    probe object never lands inside a table."""
    table = uri.split("/_delta_log/", 1)[0]
    scheme, _, rest = table.partition("://")
    parts = rest.split("/")
    return f"{scheme}://{'/'.join(parts[:-2] if len(parts) > 3 else parts[:1])}"


def _split(uri: str) -> tuple[str, str]:
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme not in storage.S3_SCHEMES:
        raise ValueError(f"not an object store URI: {uri!r}")
    bucket, _, key = rest.partition("/")
    return bucket, key


def _client(bucket: str) -> Any:
    """obstore's S3 client of ``bucket`` with the process's store (``storage.current``):
    fields the store leaves out are found as delta-rs finds them (``AWS_*`` variables, the
    instance's role)."""
    return client_of(storage.current() or storage.ObjectStore(), bucket)


def client_of(store: ObjectStore, bucket: str) -> Any:
    """obstore's S3 client of ``bucket`` in ``store`` (never logged: it holds the keys)."""
    from obstore.store import S3Store

    given = {
        "endpoint": store.endpoint_url,
        "region": store.region,
        "access_key_id": store.access_key_id,
        "secret_access_key": store.secret_access_key,
        "session_token": store.session_token,
    }
    config = {name: value for name, value in given.items() if value}
    config["conditional_put"] = "etag"  # If-None-Match: *, whatever AWS_CONDITIONAL_PUT says
    options = {"allow_http": True} if store.plain_http else None
    return S3Store(bucket, config=config, client_options=options)  # type: ignore[arg-type]
