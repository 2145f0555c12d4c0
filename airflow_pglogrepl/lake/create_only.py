"""Log entries put on an object store only where none is: S3's conditional create.

A Delta commit is the creation of the log entry of the next version, and it is atomic only if
the store refuses to create an object that exists. delta-rs sends its PUTs with
``If-None-Match: *``; the entries the lake writes itself (a column-mapped table's schema
change, a new table, a snapshot's publish) go through ``put_if_absent`` here, the same request
through the same Rust object store client (``obstore``), so a writer that stalled after it
chose a version can never overwrite the entry another writer committed meanwhile: the store
answers 412 and the late writer stops, nothing of its commit made.

A store that ignores the condition would let both writers win. ``require_conditional_create``
finds that out before the first write of a process (two creates of one probe object: the
second must be refused) and refuses such a store as a lake, naming what it needs.
"""

from __future__ import annotations

import contextlib
import threading
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


def put_if_absent(uri: str, data: bytes) -> bool:
    """Create the object at ``uri`` (``s3://bucket/key``) holding ``data``, only if no object
    is there; False (nothing written) when one is.

    A create the store answered with a conflict may be our own request's retry (the first
    attempt landed, its answer was lost): the object is then read back, and an object that
    holds exactly ``data`` is ours (every caller's entry carries an id of its own).
    """
    from obstore.exceptions import AlreadyExistsError, PreconditionError

    bucket, key = _split(uri)
    store = _client(bucket)
    require_conditional_create(uri.split("/_delta_log/", 1)[0])  # probed beside the log
    try:
        store_put(store, key, data)
    except (AlreadyExistsError, PreconditionError):
        return _holds(store, key, data)
    return True


def store_put(store: Any, key: str, data: bytes) -> None:
    """One create-only PUT (``If-None-Match: *``): the single request a commit makes."""
    import obstore

    obstore.put(store, key, data, mode="create")


def require_conditional_create(uri: str) -> None:
    """Refuse the store of ``uri`` as a lake's unless it refuses to create an object twice;
    checked once per bucket and process (``LakeLocationError`` names what it needs). A local
    lake needs nothing: its entries are created by a hard link (``delta.put_commit``)."""
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


def _probe(store: Any, bucket: str, key: str) -> None:
    import obstore
    from obstore.exceptions import (
        AlreadyExistsError,
        BaseError,
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
    try:
        store_put(store, probe, b"first")
        try:
            store_put(store, probe, b"second")
        except (AlreadyExistsError, PreconditionError):
            return
        raise LakeLocationError(f"{needs} (it let a second create overwrite the first)")
    except NotSupportedError:
        raise LakeLocationError(f"{needs} (it does not support them)") from None
    except BaseError as exc:
        raise LakeStoreUnreachableError(
            f"the object store of bucket {bucket!r} refused or did not answer the create of a "
            f"probe object "
            f"({type(exc).__name__}); nothing was written to the lake. Fix: check the store's "
            f"endpoint and the lake's credentials, then run again"
        ) from None
    finally:
        with contextlib.suppress(Exception):  # a probe object left behind is harmless
            obstore.delete(store, probe)


def _holds(store: Any, key: str, data: bytes) -> bool:
    import obstore

    return bytes(obstore.get(store, key).bytes()) == data


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
