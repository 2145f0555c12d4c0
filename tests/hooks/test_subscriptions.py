"""Subscription options newer than the subscriber are refused before anything is sent."""

from __future__ import annotations

import pytest

from airflow_pglogrepl.testing.pgcluster import PgCluster

# Behaviour here depends on the server's major version: make test runs it on 15 to 18.
pytestmark = pytest.mark.pgversion


def test_options_newer_than_the_subscriber_are_refused_before_anything_is_sent(
    subscriber: PgCluster, publisher: PgCluster
) -> None:
    """origin, password_required, run_as_owner and streaming = parallel came with 16, failover
    with 17: an older subscriber refuses them naming the version; a newer one takes them."""
    from airflow_pglogrepl.hooks.replication import DsnReplicationHook

    hook = DsnReplicationHook(subscriber.dsn())
    major = int(subscriber.execute("SHOW server_version_num")[0][0]) // 10000
    params = publisher.params()
    for options, since in (({"origin": "none"}, 16), ({"streaming": "parallel"}, 16),
                           ({"failover": False}, 17)):  # fmt: skip
        create = {"connect": False, "enabled": False, "create_slot": False, **options}
        if major < since:
            with pytest.raises(ValueError, match=f"PostgreSQL {major}, which has no .*{since}"):
                hook.ensure_subscription("too_new", publisher_params=params,
                                         publications=["p"], options=create)  # fmt: skip
            assert hook.get_subscription("too_new") is None
        else:
            made = hook.ensure_subscription("too_new", publisher_params=params,
                                            publications=["p"], options=create)  # fmt: skip
            assert made.action == "created"
            # read back from the catalog: running it again changes nothing
            again = hook.ensure_subscription("too_new", publisher_params=params,
                                             publications=["p"], options=create)  # fmt: skip
            assert again.action == "unchanged", again.details
            hook.drop_subscription("too_new")
