"""Where a lake's files live: a local directory, or a bucket of an S3-compatible object store.

One lake URI serves every engine. ``s3://bucket/prefix`` (or Spark's ``s3a://``) is read and
written by delta-rs and pyarrow as ``s3`` and by Spark through Hadoop's S3A, which is registered
for the ``s3`` scheme too: the URI a user gives is the one every process uses, and no table's
path depends on which engine wrote it.

Durability differs by kind. A local lake is made durable by fsync (``delta``): delta-rs and
Spark do not fsync, and the slot may move on as soon as a commit returns. On an object store a
PUT that returned is durable and visible to every reader (S3 has been strongly consistent for
reads after writes since 2020; the S3-compatible stores this is run against say the same), so
nothing is added there: a commit that returned is as final as the store makes it. Delta commits
are create-only PUTs (delta-rs sends ``If-None-Match: *``), so two writers of one table cannot
both win a version; Spark's S3 log store checks only inside one JVM, which is why every writer
of a lake holds the lake's writer lock on the publisher (``postgres.locks``).

The store's settings hold secrets. An ``ObjectStore`` never shows them (``repr``), the process
holds one store (``use``), a child process gets it through its environment as it gets the
database's DSN (``STORE_ENV``, never argv), and Spark gets the keys from a private AWS profile
file (``spark_settings``): Hadoop's configuration, which Spark serializes into its tasks, holds
only that file's path.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_pglogrepl.exceptions import LakeLocationError
from airflow_pglogrepl.lake.layout import is_local, local_path

# The store of the lake an application works on, as JSON, in its environment (as the DSN is).
STORE_ENV = "PGLOGREPL_LAKE_STORE"
# URI schemes that name S3 (Hadoop's for S3A and its predecessor), as pyarrow and delta-rs know it
S3_SCHEMES = ("s3", "s3a", "s3n")
# Hadoop's S3A, for every S3 scheme a lake URI may use
_S3A = "org.apache.hadoop.fs.s3a.S3AFileSystem"
_PROFILE_PROVIDER = "org.apache.hadoop.fs.s3a.auth.ProfileAWSCredentialsProvider"
_PROFILE = "pglogrepl-lake"
# a control character, or (in a key) a blank: the AWS SDK's profile reader would read more
# lines, or a comment, into it
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_BLANK = re.compile(r"\s")
_ENDPOINT = re.compile(
    r"(?i)https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:\d{1,5})?(/[A-Za-z0-9._~/-]*)?"
)
_REGION = re.compile(r"[A-Za-z0-9_-]{2,40}")


@dataclass(frozen=True)
class ObjectStore:
    """An S3-compatible store: where it answers and who the lake is to it.

    Fields left None are found as each engine finds them by default (``AWS_*`` variables, the
    instance's role): a store with no keys is how a worker with an IAM role reaches S3.
    """

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        """Refuse what an engine would read as more than one value: a control character (a
        newline in a key would add lines to Spark's profile file, which the AWS SDK would act
        on), an endpoint that is not an http(s) URL, a region that is not a region's name. The
        error names the field, never its value."""
        for name in ("endpoint_url", "region", "access_key_id", "secret_access_key",
                     "session_token"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and (not value or _CONTROL.search(value) or (
                    name != "endpoint_url" and _BLANK.search(value))):  # fmt: skip
                raise LakeLocationError(f"the lake store's {name} is empty or holds a control "
                                        f"character or a blank: refused")  # fmt: skip
        if self.endpoint_url is not None and not _ENDPOINT.fullmatch(self.endpoint_url):
            raise LakeLocationError(
                "the lake store's endpoint_url is not an http:// or https:// URL of a host "
                "(and an optional port and path): refused"
            )
        if self.region is not None and not _REGION.fullmatch(self.region):
            raise LakeLocationError("the lake store's region is not a region name (such as "
                             "eu-west-1): refused")  # fmt: skip

    @property
    def plain_http(self) -> bool:
        return bool(self.endpoint_url and self.endpoint_url.lower().startswith("http://"))

    def secrets(self) -> list[str]:
        """The values a log must never show (for Airflow's secrets masker)."""
        return [s for s in (self.secret_access_key, self.session_token) if s]

    def delta_options(self) -> dict[str, str]:
        """delta-rs' ``storage_options``. Every key is given, so no stray ``AWS_*`` variable
        of the worker decides where the lake's commits go."""
        options = {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_SESSION_TOKEN": self.session_token,
        }
        found = {k: v for k, v in options.items() if v}
        if self.plain_http:
            found["AWS_ALLOW_HTTP"] = "true"
        return found

    def arrow_filesystem(self, *, timeout_s: float | None = None) -> Any:
        """pyarrow's ``S3FileSystem`` of this store (never to be pickled: it would carry the
        keys); ``timeout_s`` bounds connecting and each request (a quick look, not a write)."""
        from pyarrow import fs

        kwargs: dict[str, Any] = {"region": self.region or "us-east-1"}
        if timeout_s is not None:
            kwargs.update(connect_timeout=timeout_s, request_timeout=timeout_s,
                          retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=2))  # fmt: skip
        if self.endpoint_url:
            scheme, _, host = self.endpoint_url.partition("://")
            kwargs.update(scheme=scheme.lower(), endpoint_override=host.rstrip("/"))
        if self.access_key_id:
            kwargs.update(access_key=self.access_key_id, secret_key=self.secret_access_key,
                          session_token=self.session_token)  # fmt: skip
        return fs.S3FileSystem(**kwargs)

    def hadoop_settings(self, profile_file: str | None) -> dict[str, str]:
        """Hadoop's S3A configuration (``fs.s3a.*``) of this store: where it answers and, with
        keys, the profile file that holds them (written by ``spark_settings``)."""
        settings = {"fs.s3.impl": _S3A, "fs.s3n.impl": _S3A}
        if self.endpoint_url:
            settings.update({
                "fs.s3a.endpoint": self.endpoint_url,
                "fs.s3a.path.style.access": "true",
                "fs.s3a.connection.ssl.enabled": "false" if self.plain_http else "true",
            })  # fmt: skip
        if self.region:
            settings["fs.s3a.endpoint.region"] = self.region
        if profile_file is not None:
            settings.update({
                "fs.s3a.aws.credentials.provider": _PROFILE_PROVIDER,
                "fs.s3a.auth.profile.file": profile_file,
                "fs.s3a.auth.profile.name": _PROFILE,
            })  # fmt: skip
        return settings

    def profile(self) -> str:
        """The keys as an AWS shared-credentials profile (what S3A's profile provider reads)."""
        lines = [f"[{_PROFILE}]", f"aws_access_key_id = {self.access_key_id}",
                 f"aws_secret_access_key = {self.secret_access_key}"]  # fmt: skip
        if self.session_token:
            lines.append(f"aws_session_token = {self.session_token}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ObjectStore:
        values = json.loads(text)
        return cls(**{k: values.get(k) for k in cls.__dataclass_fields__})


_store: ObjectStore | None = None


def use(store: ObjectStore | None) -> None:
    """Make ``store`` the one this process reaches its object-store lake through (None: each
    engine's defaults)."""
    global _store
    _store = store


def current() -> ObjectStore | None:
    return _store


def use_for_lake(uri: str) -> None:
    """Make current the store of the lake at ``uri`` that an operator handed this application
    (``STORE_ENV``); for a lake on an object store without one, the engines' defaults."""
    text = os.environ.get(STORE_ENV)
    if text:
        use(ObjectStore.from_json(text))
    else:
        use(ObjectStore() if is_object_store(uri) else None)


@contextlib.contextmanager
def using(store: ObjectStore | None) -> Iterator[None]:
    """``store`` current while the block runs, the one before it after."""
    before = _store
    use(store)
    try:
        yield
    finally:
        use(before)


def is_object_store(uri: str) -> bool:
    return uri.partition("://")[0] in S3_SCHEMES


def canonical(uri: str) -> str:
    """One spelling of a lake URI for whatever names it (``s3a://`` and ``s3n://`` are
    ``s3://``; no trailing slash): one lake, one Asset."""
    scheme, sep, rest = uri.partition("://")
    if sep and scheme in S3_SCHEMES:
        return f"s3://{rest.rstrip('/')}"
    return uri.rstrip("/")


def delta_options(uri: str) -> dict[str, str] | None:
    """delta-rs' ``storage_options`` for a table at ``uri``: None for a local table, or where
    no store was given (the environment's then)."""
    if is_local(uri) or _store is None:
        return None
    return _store.delta_options()


def filesystem(uri: str) -> tuple[Any, str]:
    """pyarrow's filesystem of a table or folder URI, and the path in it."""
    from pyarrow import fs

    if is_local(uri):
        return fs.LocalFileSystem(), os.path.abspath(local_path(uri))
    scheme, _, rest = uri.partition("://")
    if scheme in S3_SCHEMES:
        system = (_store or ObjectStore()).arrow_filesystem()
        return system, rest.rstrip("/")
    found, path = fs.FileSystem.from_uri(uri)
    return found, path


def commit_fingerprint(system: Any, table_path: str, version: int) -> list[int] | None:
    """The size and modification time of the Delta commit file of ``version`` of the table at
    ``table_path`` in ``system`` (None: no such file). A table written again from scratch
    reaches the same version numbers with other commit files: this tells them apart."""
    from pyarrow import fs

    info = system.get_file_info(f"{table_path}/_delta_log/{version:020d}.json")
    if info.type != fs.FileType.File:
        return None
    return [int(info.size or 0), int(info.mtime_ns or 0)]


def spark_settings() -> dict[str, str]:
    """``spark.hadoop.*`` settings for the current store (empty without one). Keys go to a
    private profile file, removed when the process ends, not into Spark's configuration."""
    if _store is None:
        return {}
    profile_file = None
    if _store.access_key_id:
        directory = tempfile.mkdtemp(prefix="pglogrepl-s3-")
        atexit.register(shutil.rmtree, directory, True)
        exit_on_sigterm()
        profile_file = os.path.join(directory, "credentials")
        fd = os.open(profile_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(_store.profile())
    return {f"spark.hadoop.{k}": v for k, v in _store.hadoop_settings(profile_file).items()}


def exit_on_sigterm() -> None:
    """A SIGTERM (the operator's ``on_kill``, a worker shutting down) ends the process through
    ``SystemExit``, so ``finally`` blocks and ``atexit`` run (the removal of a credentials profile
    or of a snapshot's passfile, the writer lock's release): by default the process would die at
    once and leave secrets on disk. Only where nothing else handles it."""
    import signal
    import sys
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
