"""Connection parameters that can travel: the password moved into a libpq passfile.

Work shipped to Spark executors is pickled and sent over Spark's RPC, which a standalone cluster
does not authenticate by default, and its bytes can be seen again in event logs and heap dumps.
So what travels are the libpq parameters *without* the password, plus ``passfile``: the path of
a file only this OS user can read, written by the driver for the job's duration and removed
after it. libpq reads the password from there when the parameters hold none. An executor's own
``PGPASSWORD`` still comes first, which is how executors on other hosts, which cannot read the
driver's file, get it (an explicit ``passfile`` replaces ``PGPASSFILE`` and ``~/.pgpass``).
See https://www.postgresql.org/docs/15/libpq-pgpass.html
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["PASSFILE_HINT", "passfile_line", "travelling_params"]

PASSFILE_HINT = (
    "the password reaches Spark executors through a file on the driver's host, readable only by "
    "its OS user: executors on another host or under another user need it from their own "
    "environment (PGPASSWORD on the executors, set by whoever deploys them) or certificate "
    "authentication (sslcert/sslkey)"
)


def passfile_line(password: str) -> str:
    """One passfile entry that matches any host, port, database and user: the file serves this
    one connection only. ``:`` and ``\\`` are escaped as libpq's parser expects."""
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    return f"*:*:*:*:{escaped}\n"


@contextmanager
def travelling_params(params: Mapping[str, str]) -> Iterator[dict[str, str]]:
    """``params`` without ``password``; with ``passfile`` naming a 0600 file that holds it, in a
    0700 directory removed on the way out. Without a password, ``params`` as they are."""
    password = params.get("password")
    if password and ("\n" in password or "\r" in password):
        raise ValueError(
            "the source password contains a line break, which a libpq passfile cannot hold; "
            "Spark tasks are sent no password but a passfile. Fix: change the password"
        )
    rest = {k: v for k, v in params.items() if k != "password"}
    if not password:
        yield rest
        return
    directory = tempfile.mkdtemp(prefix="pglogrepl-pass-")  # 0700 by mkdtemp's contract
    try:
        path = os.path.join(directory, "pgpass")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(passfile_line(password))
        yield {**rest, "passfile": path}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
