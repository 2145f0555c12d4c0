"""The few file operations the sink's commit protocol needs, on local disk or any Hadoop URI.

Spark writes the Parquet data; this module only reads and writes small commit records, lists,
moves and deletes. Local paths use ``os`` with fsync (a commit record is durable before the slot
moves). Other URIs (``hdfs://``, ``s3a://`` ...) go through Spark's own Hadoop ``FileSystem`` in
the driver's JVM, so whatever Spark can write, the commit protocol can manage; on object stores a
rename is a copy, which is slower but still safe because every step is idempotent and the commit
record is written last.
"""

from __future__ import annotations

import os
from typing import Any, Protocol
from urllib.parse import urlparse


class Storage(Protocol):
    """File operations on the sink, by URI or path string."""

    def join(self, *parts: str) -> str: ...
    def exists(self, path: str) -> bool: ...
    def list_names(self, path: str) -> list[str]: ...
    def read_text(self, path: str) -> str: ...
    def write_text_atomic(self, path: str, text: str) -> None: ...
    def move(self, src: str, dst: str) -> None: ...
    def delete(self, path: str) -> None: ...
    def makedirs(self, path: str) -> None: ...


def is_local(uri: str) -> bool:
    """True for plain paths and ``file:`` URIs."""
    return urlparse(uri).scheme in ("", "file")


def local_path(uri: str) -> str:
    """The filesystem path of a local sink URI."""
    parsed = urlparse(uri)
    return parsed.path if parsed.scheme == "file" else uri


class LocalStorage:
    """A sink on local (or locally mounted) disk; renames are atomic, records are fsynced."""

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def list_names(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def read_text(self, path: str) -> str:
        with open(path, encoding="utf-8") as handle:
            return handle.read()

    def write_text_atomic(self, path: str, text: str) -> None:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(directory)

    def move(self, src: str, dst: str) -> None:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(src, dst)
        _fsync_dir(os.path.dirname(dst))

    def delete(self, path: str) -> None:
        import shutil

        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.exists(path):
            os.remove(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HadoopStorage:
    """A sink on any filesystem Spark's Hadoop layer knows, driven from the driver's JVM."""

    def __init__(self, spark: Any, root: str) -> None:
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()
        self._fs = jvm.org.apache.hadoop.fs.Path(root).getFileSystem(self._conf)

    def _path(self, path: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(path)

    def join(self, *parts: str) -> str:
        return "/".join(p.rstrip("/") for p in parts)

    def exists(self, path: str) -> bool:
        return bool(self._fs.exists(self._path(path)))

    def list_names(self, path: str) -> list[str]:
        if not self.exists(path):
            return []
        return sorted(str(s.getPath().getName()) for s in self._fs.listStatus(self._path(path)))

    def read_text(self, path: str) -> str:
        stream = self._fs.open(self._path(path))
        try:
            reader = self._jvm.java.io.BufferedReader(
                self._jvm.java.io.InputStreamReader(stream, "UTF-8")
            )
            lines = []
            line = reader.readLine()
            while line is not None:
                lines.append(str(line))
                line = reader.readLine()
            return "\n".join(lines)
        finally:
            stream.close()

    def write_text_atomic(self, path: str, text: str) -> None:
        tmp = self._path(f"{path}.tmp")
        stream = self._fs.create(tmp, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
            stream.hsync()
        finally:
            stream.close()
        self._fs.delete(self._path(path), False)
        if not self._fs.rename(tmp, self._path(path)):
            raise OSError(f"could not rename {path}.tmp to {path}")

    def move(self, src: str, dst: str) -> None:
        self._fs.mkdirs(self._path(dst).getParent())
        if not self._fs.rename(self._path(src), self._path(dst)):
            raise OSError(f"could not move {src} to {dst}")

    def delete(self, path: str) -> None:
        self._fs.delete(self._path(path), True)

    def makedirs(self, path: str) -> None:
        self._fs.mkdirs(self._path(path))


def storage_for(uri: str, spark: Any | None = None) -> Storage:
    """Local storage for paths and ``file:`` URIs; Hadoop storage (needs ``spark``) otherwise."""
    if is_local(uri):
        return LocalStorage()
    if spark is None:
        raise ValueError(f"sink {uri!r} is not local: a Spark session is needed to reach it")
    return HadoopStorage(spark, uri)
