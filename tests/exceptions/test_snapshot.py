"""The snapshot's read errors: each says nothing was copied or committed, names what blocked it
and the fix, and is retryable (the snapshot runs again from its start)."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.exceptions import snapshot as errors


@pytest.mark.parametrize(
    ("error", "names"),
    [
        (errors.SnapshotLockError('public."Or ders"', 60, ["pid 42: VACUUM FULL"]),
         ['public."Or ders"', "within 60s", "pid 42: VACUUM FULL", "Nothing was copied"]),
        (errors.SnapshotLockError("public.t", 1.5, []),
         ["within 1.5s", "a session this role cannot see"]),
        (errors.TableRewrittenError(["public.a", "public.b"]),
         ["public.a, public.b", "pg_repack", "Nothing was copied"]),
        (errors.CatalogChangedError([f"change {n}" for n in range(12)]),
         ["change 0", "change 9", " ...", "Nothing was committed"]),
    ],
)  # fmt: skip
def test_each_read_error_names_what_blocked_it_and_the_fix(
    error: errors.SnapshotReadError, names: list[str]
) -> None:
    text = str(error)
    assert "Fix:" in text and error.retryable
    for name in names:
        assert name in text, (name, text)
    assert "change 10" not in str(errors.CatalogChangedError([f"change {n}" for n in range(12)]))


def test_a_failed_arrow_peek_is_retried_through_the_reference_path() -> None:
    assert errors.ArrowPeekError("adbc missing").retryable
