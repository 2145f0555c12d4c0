"""Errors about the objects a task works on (publications, subscriptions, roles, checks): each
names the object and the fix; a missing publication lists what the database has and guesses the
one meant."""

from __future__ import annotations

from airflow_pglogrepl.exceptions import objects as errors


def test_a_missing_publication_lists_what_is_there_and_guesses() -> None:
    error = errors.PublicationNotFoundError(
        ["lake_pbu"], "lake_shop", existing=["lake_pub", "other"], server="db1:5432/shop"
    )
    text = str(error)
    assert "publication 'lake_pbu' does not exist on db1:5432/shop" in text
    assert "'lake_pub', 'other'" in text and "did you mean 'lake_pub'?" in text
    assert "Nothing was committed and the slot did not move" in text and "Fix:" in text
    assert error.names == ["lake_pbu"] and error.existing == ["lake_pub", "other"]


def test_many_missing_publications_each_get_their_guess_and_the_list_is_cut() -> None:
    existing = [f"tenant_{n:03}" for n in range(30)]
    text = str(errors.PublicationNotFoundError(["tenant_01", "tenant_0002"], existing=existing))
    assert "publications 'tenant_01', 'tenant_0002' do not exist" in text
    assert "and 10 more" in text and "'tenant_029'" not in text  # 20 shown
    assert "for 'tenant_01'" in text and "for 'tenant_0002'" in text


def test_on_postgresql_18_a_missing_publication_says_why_it_matters() -> None:
    text = str(errors.PublicationNotFoundError(["p"], "s", existing=[], server_version=180002))
    assert "The publications there: none" in text
    assert "on PostgreSQL 18 a missing publication is only a warning" in text
    assert "only a warning" not in str(
        errors.PublicationNotFoundError(["p"], server_version=170000)
    )


def test_definition_privilege_and_exposure_errors_name_the_object_and_the_fix() -> None:
    conflict = errors.DefinitionConflictError("publication", "p", "is FOR ALL TABLES", "drop it")
    assert str(conflict) == "publication 'p' exists but is FOR ALL TABLES. Fix: drop it"
    missing = errors.ObjectNotFoundError("subscription", 'Sub "x"', "create it first")
    assert str(missing) == "subscription 'Sub \"x\"' does not exist. Fix: create it first"
    privilege = str(errors.PrivilegeError("app", "use replication slots", "ALTER ROLE app ..."))
    assert "role 'app' may not use replication slots. Nothing was done. Fix:" in privilege
    exposure = str(errors.PasswordExposureError("subscription", "s", "owner", ["log_statement"]))
    assert "log_statement" in exposure and "Nothing was sent" in exposure
    assert "GRANT SET ON PARAMETER <name> TO owner" in exposure


def test_a_failed_check_lists_each_problem_on_its_own_line() -> None:
    error = errors.ParityMismatchError(4, ["public.a: 3 rows against 2", "public.b: checksum"])
    assert str(error) == (
        "parity check failed for 2 of 4 tables:\n- public.a: 3 rows against 2\n- public.b: checksum"
    )
    assert error.problems == ["public.a: 3 rows against 2", "public.b: checksum"]
    assert str(errors.SequenceSyncError(["x"], refused=True)).startswith(
        "sequence sync refused, nothing was changed:"
    )


def test_retryable_only_when_running_again_can_help() -> None:
    assert errors.FenceLockBusyError("busy").retryable
    assert isinstance(errors.FenceLockBusyError("busy"), errors.FenceNotHeldError)
    assert not getattr(errors.FenceNotHeldError("a group role can still write"), "retryable", False)
    assert errors.GateFailedError("lost", retryable=True).retryable
    assert not errors.GateFailedError("lag too large").retryable
    assert errors.SparkApplicationError("X", "m", retryable=True).retryable
