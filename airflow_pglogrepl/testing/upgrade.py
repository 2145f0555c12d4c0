"""A major upgrade of a test cluster with ``pg_upgrade``: what the upgrade tests run against.

``pg_upgrade`` runs the old cluster's ``postgres``, ``pg_ctl``, ``pg_controldata`` and
``pg_resetwal``, so the old major's binaries must be a complete build (the matrix's 17 and 18
are). Logical slots come along from 17 on when they are caught up: each is created again in
the new cluster, at the new cluster's WAL position, with its name, plugin and ``failover``. The
new cluster gets a system identifier of its own and starts on timeline 1; its WAL begins past
the old one's end, so its LSNs go on rising.
"""

from __future__ import annotations

from pathlib import Path

from airflow_pglogrepl.testing.pgcluster import ClusterError, PgCluster, free_port

__all__ = ["pg_upgrade"]


def pg_upgrade(old: PgCluster, bindir: Path, basedir: Path) -> PgCluster:
    """Stop ``old`` (fast: a clean shutdown, as ``pg_upgrade`` wants), upgrade it into a new
    cluster of ``bindir``'s major under ``basedir`` (``--link``), and start that one; ``old``
    is left stopped and no longer startable."""
    checksums = _checksums_as(old)
    old.stop("fast")
    new = PgCluster(name=f"{old.name}-upgraded", basedir=basedir, port=free_port(), bindir=bindir,
                    settings=old.settings, superuser=old.superuser, password=old.password,
                    initdb_options=checksums)  # fmt: skip
    new.init()
    done = new._run(
        [str(bindir / "pg_upgrade"), "-b", str(old.bindir), "-B", str(bindir),
         "-d", str(old.datadir), "-D", str(new.datadir), "-U", old.superuser,
         "-p", str(old.port), "-P", str(new.port), "-s", str(new.socket_dir), "--link"],
        cwd=basedir, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"pg_upgrade of {old.name} failed:\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-2000:]}")  # fmt: skip
    new.start()
    return new


def _checksums_as(old: PgCluster) -> tuple[str, ...]:
    """``initdb`` of 18 turns data checksums on by default, and ``pg_upgrade`` needs the new
    cluster to have them as the old one has: the test clusters are made without."""
    (on,) = old.execute("SHOW data_checksums")[0]
    return ("--no-data-checksums",) if on == "off" else ("--data-checksums",)
