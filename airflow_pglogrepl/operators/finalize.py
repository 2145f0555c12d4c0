"""Finish the cutover: drop the subscription (and its slot), optionally replicate back for rollback.

After parity passed, the subscriber is the new primary. Its subscription is disabled and dropped,
which drops the slot on the old primary (a slot left there would retain WAL forever). For a
rollback path the new primary can publish the same tables and the old primary subscribe to them
with ``copy_data = false``: the old primary then follows every write made after the cutover.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context

from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.hooks.for_connection import replication_hook
from airflow_pglogrepl.operators.arguments import names

if TYPE_CHECKING:
    from airflow_pglogrepl.hooks.replication import PgLogicalReplicationHook
    from airflow_pglogrepl.tables import TableRef


# XCom key FinalizeCutoverOperator pushes the moment the subscription is dropped.
DROPPED_KEY = "subscription_dropped"


class FinalizeCutoverOperator(TaskBoundary, BaseOperator):
    """Disable and drop the subscription; optionally set up reverse replication.

    1. ``ALTER SUBSCRIPTION ... DISABLE`` and ``DROP SUBSCRIPTION`` on the subscriber (the new
       primary); its slot on the publisher goes with it. An unreachable publisher leaves the
       slot behind: it is reported (``slot_left_behind``) and must be dropped there.
    2. With ``reverse_publication``: a publication of the subscription's tables (or ``tables``)
       on the new primary.
    3. With ``reverse_subscription`` (needs ``reverse_publication`` and ``publisher_conn_id``): a
       subscription on the old primary to that publication, ``copy_data = false``, so the old
       primary follows the new one (the rollback path). ``new_primary_host`` /
       ``new_primary_port`` give the new primary's address as the old primary's server sees it.

    Running it again is harmless: a missing subscription is not an error, and the reverse
    objects are reconciled.

    :param subscription: the cutover's subscription on the subscriber.
    :param subscriber_conn_id: Airflow connection of the subscriber (the new primary).
    :param publisher_conn_id: Airflow connection of the publisher (the old primary); also used to
        confirm its slot is gone.
    :param reverse_publication: name of the publication to create on the new primary.
    :param reverse_subscription: name of the subscription to create on the old primary.
    :param tables: tables of the reverse publication (default: the subscription's tables).
    :param new_primary_host: host the old primary's server uses to reach the new primary.
    :param new_primary_port: port the old primary's server uses to reach the new primary.
    :param connect_timeout: libpq ``connect_timeout`` of the reverse subscription, in seconds.
    :param subscriber_database: subscriber database, when not the connection's.
    :param publisher_database: publisher database, when not the connection's.
    """

    template_fields: Sequence[str] = (
        "subscription", "subscriber_conn_id", "publisher_conn_id", "reverse_publication",
        "reverse_subscription", "tables", "new_primary_host", "new_primary_port",
        "subscriber_database", "publisher_database",
    )  # fmt: skip
    ui_color = "#d6eaf8"

    def __init__(
        self,
        *,
        subscription: str,
        subscriber_conn_id: str,
        publisher_conn_id: str | None = None,
        reverse_publication: str | None = None,
        reverse_subscription: str | None = None,
        tables: str | Sequence[str] | None = None,
        new_primary_host: str | None = None,
        new_primary_port: int | str | None = None,
        connect_timeout: int = 10,
        subscriber_database: str | None = None,
        publisher_database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if reverse_subscription and not reverse_publication:
            raise ValueError("reverse_subscription needs reverse_publication (what it subscribes)")
        if reverse_subscription and not publisher_conn_id:
            raise ValueError("reverse_subscription needs publisher_conn_id (the old primary)")
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.publisher_conn_id = publisher_conn_id
        self.reverse_publication = reverse_publication
        self.reverse_subscription = reverse_subscription
        self.tables = tables
        self.new_primary_host = new_primary_host
        self.new_primary_port = new_primary_port
        self.connect_timeout = connect_timeout
        self.subscriber_database = subscriber_database
        self.publisher_database = publisher_database

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pglogrepl.tables import parse_tables

        new_primary = replication_hook(self.subscriber_conn_id, self.subscriber_database)
        old_primary = (
            replication_hook(self.publisher_conn_id, self.publisher_database)
            if self.publisher_conn_id
            else None
        )
        result: dict[str, Any] = {
            "subscription": self.subscription,
            "server_version": new_primary.server_facts().version,
        }

        info = new_primary.get_subscription(self.subscription)
        tables: list[TableRef] = parse_tables(names(self.tables))
        if info is None:
            self.log.info("Subscription %s does not exist (already dropped)", self.subscription)
            result.update(
                dropped=False, already_dropped=True, slot_name=None, slot_left_behind=None
            )
        else:
            if not tables:
                status = new_primary.subscription_status(self.subscription)
                tables = [rel.table for rel in status.relations]
            if info.enabled:
                new_primary.disable_subscription(self.subscription)
            dropped = new_primary.drop_subscription(self.subscription)
            # The new primary stands alone from here. Pushed at once: should a step below fail,
            # the summary must not take this run for one that can simply be triggered again.
            context["ti"].xcom_push(
                key=DROPPED_KEY, value={"dropped_at": dt.datetime.now(dt.UTC).isoformat()}
            )
            result.update(
                dropped=dropped.dropped,
                slot_name=info.slot_name,
                slot_left_behind=dropped.slot_left_behind,
            )
        if old_primary is not None and result.get("slot_name"):
            present = {s.name for s in old_primary.list_slots()}
            result["publisher_slot_present"] = result["slot_name"] in present
            if result["publisher_slot_present"]:
                self.log.warning(
                    "Slot %s is still on the publisher and retains WAL there until dropped",
                    result["slot_name"],
                )

        if self.reverse_publication:
            result["reverse_publication"] = self._reverse_publication(new_primary, tables)
        if self.reverse_subscription:
            assert old_primary is not None and self.reverse_publication
            result["reverse_subscription"] = self._reverse_subscription(new_primary, old_primary)
        if result.get("dropped"):
            # Reverse replication is in place too: the end of the write downtime
            # (CutoverSummaryOperator), on the worker's clock like the fence's start. A retry
            # that found the subscription gone cannot know when it went: no figure then.
            result["switched_at"] = dt.datetime.now(dt.UTC).isoformat()
        return result

    def _reverse_publication(
        self, new_primary: PgLogicalReplicationHook, tables: list[TableRef]
    ) -> dict[str, Any]:
        from airflow_pglogrepl.models.records import PublishedTable

        assert self.reverse_publication
        if not tables:
            if new_primary.get_publication(self.reverse_publication) is not None:
                return {
                    "name": self.reverse_publication,
                    "action": "unchanged",
                    "details": ["kept as it is: no table list to reconcile it with"],
                }
            raise ValueError(
                f"reverse publication {self.reverse_publication!r}: the subscription is gone, "
                f"so its tables are unknown; give tables=[...]"
            )
        return new_primary.ensure_publication(
            self.reverse_publication, tables=[PublishedTable(table=t) for t in tables]
        ).to_dict()

    def _reverse_subscription(
        self, new_primary: PgLogicalReplicationHook, old_primary: PgLogicalReplicationHook
    ) -> dict[str, Any]:
        from airflow_pglogrepl.conninfo import DEFAULT_APPLICATION_NAME
        from airflow_pglogrepl.exceptions import SlotNotFoundError
        from airflow_pglogrepl.operators.subscription import slot_name_for

        assert self.reverse_subscription and self.reverse_publication
        params = new_primary.connection_params()
        if params.get("application_name") == DEFAULT_APPLICATION_NAME:
            del params["application_name"]  # the walsender then reports the subscription's name
        if self.new_primary_host:
            params["host"] = self.new_primary_host
        if self.new_primary_port:
            params["port"] = str(self.new_primary_port)
        params.setdefault("connect_timeout", str(self.connect_timeout))
        slot = slot_name_for(self.reverse_subscription)
        options: dict[str, Any] = {"copy_data": False, "slot_name": slot}
        existing = old_primary.get_subscription(self.reverse_subscription)
        if existing is None and new_primary.instance_identity() == old_primary.instance_identity():
            # One instance: CREATE SUBSCRIPTION would wait for its own slot creation.
            try:
                new_primary.get_slot(slot, plugin="pgoutput")
            except SlotNotFoundError:
                new_primary.create_logical_slot(slot, plugin="pgoutput")
            options["create_slot"] = False
        result = old_primary.ensure_subscription(
            self.reverse_subscription,
            publisher_params=params,
            publications=[self.reverse_publication],
            options=options,
        )
        return {**result.to_dict(), "slot_name": slot}
