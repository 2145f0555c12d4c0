"""Create (idempotently), alter and drop subscriptions on the subscriber."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any, Literal

from airflow.sdk import BaseOperator, Context

from airflow_pglogrepl.boundary import TaskBoundary
from airflow_pglogrepl.hooks.for_connection import replication_hook

_SLOT_OK = re.compile(r"[a-z0-9_]{1,63}")


def slot_name_for(subscription: str) -> str:
    """The subscription's name when it is a valid slot name, else a derived valid one.

    PostgreSQL names the slot after the subscription by default, and slot names allow only
    ``[a-z0-9_]``: a subscription called ``"Orders → lake"`` would fail to create its slot.
    """
    if _SLOT_OK.fullmatch(subscription):
        return subscription
    base = re.sub(r"[^a-z0-9_]+", "_", subscription.lower()).strip("_")[:40] or "sub"
    digest = hashlib.sha256(subscription.encode()).hexdigest()[:8]
    return f"{base}_{digest}"


class CreateSubscriptionOperator(TaskBoundary, BaseOperator):
    """Create a subscription to the publisher's publications, or reconcile an existing one.

    The ``CONNECTION`` string is built from the publisher's Airflow connection (host, port,
    login, password, database and libpq extras such as ``sslmode``); ``publisher_host`` /
    ``publisher_port`` give the address as the *subscriber's server* sees it (containers). The
    password never appears in logs, XCom or errors. When publisher and subscriber are the same
    instance, the slot is created on the publisher first and the subscription uses it with
    ``create_slot = false`` (otherwise ``CREATE SUBSCRIPTION`` waits for itself). A publication
    missing on the publisher fails the task before anything is created (unless ``connect`` is
    false), naming those that exist and the closest.

    :param subscription: subscription name.
    :param publications: publications to subscribe to.
    :param publisher_conn_id: Airflow connection of the publisher.
    :param subscriber_conn_id: Airflow connection of the subscriber.
    :param publisher_host: host the subscriber's server uses to reach the publisher.
    :param publisher_port: port the subscriber's server uses to reach the publisher.
    :param publisher_database: publisher database, when not the connection's.
    :param subscriber_database: subscriber database, when not the connection's.
    :param copy_data: copy existing rows first (the i→d→s→r table sync).
    :param create_slot: create the slot on the publisher (default: yes; no on the same instance).
    :param enabled: start replicating at once.
    :param connect: connect to the publisher at creation (False implies no slot, no copy).
    :param slot_name: slot name (default: the subscription's, made valid if needed).
    :param synchronous_commit: the apply worker's ``synchronous_commit``.
    :param streaming: stream large in-progress transactions (``True``/``False``/``"parallel"``;
        ``"parallel"`` needs PostgreSQL 16+).
    :param binary: transfer values in binary form.
    :param two_phase: decode prepared transactions at PREPARE.
    :param disable_on_error: disable the subscription on an apply error (PostgreSQL 15+).
    :param origin: ``"none"`` to receive only changes made on the publisher itself, not ones
        it replicated from elsewhere (bidirectional setups; PostgreSQL 16+), or ``"any"``.
    :param password_required: ``False`` lets a non-superuser's subscription connect without a
        password (set by a superuser; PostgreSQL 16+).
    :param run_as_owner: apply as the subscription's owner instead of each table's owner
        (PostgreSQL 16+).
    :param failover: the slot is synchronized to the publisher's standbys, so the subscription
        survives a publisher failover (PostgreSQL 17+; needs ``sync_replication_slots``).
    Options the subscriber's version does not have are refused before anything is sent.
    :param connect_timeout: libpq ``connect_timeout`` the subscriber uses, in seconds.
    """

    template_fields: Sequence[str] = (
        "subscription", "publications", "slot_name", "publisher_host", "publisher_port",
        "publisher_conn_id", "subscriber_conn_id", "publisher_database", "subscriber_database",
    )  # fmt: skip
    ui_color = "#d5f5e3"

    def __init__(
        self,
        *,
        subscription: str,
        publications: Sequence[str],
        publisher_conn_id: str,
        subscriber_conn_id: str,
        publisher_host: str | None = None,
        publisher_port: int | str | None = None,
        publisher_database: str | None = None,
        subscriber_database: str | None = None,
        copy_data: bool | None = None,
        create_slot: bool | None = None,
        enabled: bool | None = None,
        connect: bool | None = None,
        slot_name: str | None = None,
        synchronous_commit: str | None = None,
        streaming: bool | str | None = None,
        binary: bool | None = None,
        two_phase: bool | None = None,
        disable_on_error: bool | None = None,
        origin: str | None = None,
        password_required: bool | None = None,
        run_as_owner: bool | None = None,
        failover: bool | None = None,
        connect_timeout: int = 10,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.subscription = subscription
        self.publications = publications
        self.publisher_conn_id = publisher_conn_id
        self.subscriber_conn_id = subscriber_conn_id
        self.publisher_host = publisher_host
        self.publisher_port = publisher_port
        self.publisher_database = publisher_database
        self.subscriber_database = subscriber_database
        self.slot_name = slot_name
        self.connect_timeout = connect_timeout
        self.options: dict[str, Any] = {
            key: value
            for key, value in {
                "copy_data": copy_data,
                "create_slot": create_slot,
                "enabled": enabled,
                "connect": connect,
                "synchronous_commit": synchronous_commit,
                "streaming": streaming,
                "binary": binary,
                "two_phase": two_phase,
                "disable_on_error": disable_on_error,
                "origin": origin,
                "password_required": password_required,
                "run_as_owner": run_as_owner,
                "failover": failover,
            }.items()
            if value is not None
        }

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_pglogrepl.conninfo import DEFAULT_APPLICATION_NAME

        publisher = replication_hook(self.publisher_conn_id, self.publisher_database)
        subscriber = replication_hook(self.subscriber_conn_id, self.subscriber_database)
        params = publisher.connection_params()
        if params.get("application_name") == DEFAULT_APPLICATION_NAME:
            # The walsender then reports the subscription's own name (synchronous_standby_names).
            del params["application_name"]
        if self.publisher_host:
            params["host"] = self.publisher_host
        if self.publisher_port:
            params["port"] = str(self.publisher_port)
        params.setdefault("connect_timeout", str(self.connect_timeout))

        options = dict(self.options)
        slot = self.slot_name or slot_name_for(self.subscription)
        options["slot_name"] = slot
        connect = options.get("connect", True)
        if connect:
            # the server only warns (15+), and the subscription's workers then fail in a loop
            publisher.require_publications(
                [str(p) for p in self.publications],
                consequence="Nothing was created on the subscriber or the publisher",
            )
        if options.get("failover") and connect:
            self._publisher_keeps_failover_slots(publisher, slot)
        same_instance = bool(connect) and (
            publisher.instance_identity() == subscriber.instance_identity()
        )
        if same_instance and options.get("create_slot", True):
            self._ensure_slot(publisher, slot, failover=bool(options.get("failover")))
            options["create_slot"] = False
        if not connect:
            options.pop("slot_name")  # connect=false cannot name a slot it will not create
        if subscriber.get_subscription(self.subscription) is not None:
            options.pop("create_slot", None)  # only meaningful at creation
        result = subscriber.ensure_subscription(
            self.subscription,
            publisher_params=params,
            publications=list(self.publications),
            options=options,
        )
        return {**result.to_dict(), "slot_name": slot, "same_instance": same_instance}

    def _publisher_keeps_failover_slots(self, publisher: Any, slot: str) -> None:
        """``failover`` makes the publisher's slot a failover slot: refused, before anything is
        created, on a publisher that cannot keep one (``FailoverSlotUnsupportedError``)."""
        from airflow_pglogrepl.conninfo import describe
        from airflow_pglogrepl.models.failover import wants_failover

        facts = publisher.server_facts()
        wants_failover(slot, describe(publisher.connection_params()), facts.version_num,
                       in_hot_standby=facts.in_recovery, requested=True)  # fmt: skip

    def _ensure_slot(self, publisher: Any, slot: str, *, failover: bool) -> None:
        """The slot ``CREATE SUBSCRIPTION`` cannot create on its own instance, as the
        subscription's ``failover`` option asks."""
        from airflow_pglogrepl.exceptions import SlotNotFoundError

        try:
            publisher.get_slot(slot, plugin="pgoutput")
            self.log.info("Same instance: reusing existing slot %s", slot)
        except SlotNotFoundError:
            publisher.create_logical_slot(slot, plugin="pgoutput", failover=failover)
            self.log.info("Same instance: created slot %s before the subscription", slot)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage (``operators.lineage``): the publisher's published tables in,
        the subscriber's tables of the same names out."""
        from airflow_pglogrepl.operators.lineage import subscription_lineage

        return subscription_lineage(
            replication_hook(self.publisher_conn_id, self.publisher_database),
            replication_hook(self.subscriber_conn_id, self.subscriber_database),
            [str(p) for p in self.publications],
        )


class AlterSubscriptionOperator(TaskBoundary, BaseOperator):
    """Enable, disable or refresh a subscription.

    :param subscription: subscription name.
    :param subscriber_conn_id: Airflow connection of the subscriber.
    :param action: ``enable``, ``disable`` or ``refresh`` (pick up publication table changes).
    :param copy_data: with ``refresh``: copy existing rows of newly added tables.
    :param subscriber_database: subscriber database, when not the connection's.
    """

    template_fields: Sequence[str] = (
        "subscription", "action", "subscriber_conn_id", "subscriber_database",
    )  # fmt: skip

    def __init__(
        self,
        *,
        subscription: str,
        subscriber_conn_id: str,
        action: Literal["enable", "disable", "refresh"],
        copy_data: bool = True,
        subscriber_database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if action not in ("enable", "disable", "refresh"):
            raise ValueError(f"action must be enable, disable or refresh, not {action!r}")
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.action = action
        self.copy_data = copy_data
        self.subscriber_database = subscriber_database

    def execute(self, context: Context) -> dict[str, Any]:
        hook = replication_hook(self.subscriber_conn_id, self.subscriber_database)
        if self.action == "enable":
            hook.enable_subscription(self.subscription)
        elif self.action == "disable":
            hook.disable_subscription(self.subscription)
        else:
            hook.refresh_subscription(self.subscription, copy_data=self.copy_data)
        return {"subscription": self.subscription, "action": self.action}


class DropSubscriptionOperator(TaskBoundary, BaseOperator):
    """Drop a subscription; its slot on the publisher goes with it when the publisher answers.

    When the publisher is unreachable the subscription is detached from its slot and dropped;
    the slot left behind is named in the log and in XCom (``slot_left_behind``): it retains WAL
    on the publisher until dropped there. So may the table-sync slots of tables that were not
    ready yet (``sync_slots_left_behind``, each with the command that drops it in the log).
    Succeeds when the subscription is already gone.

    :param subscription: subscription name.
    :param subscriber_conn_id: Airflow connection of the subscriber.
    :param subscriber_database: subscriber database, when not the connection's.
    """

    template_fields: Sequence[str] = ("subscription", "subscriber_conn_id", "subscriber_database")

    def __init__(
        self,
        *,
        subscription: str,
        subscriber_conn_id: str,
        subscriber_database: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.subscription = subscription
        self.subscriber_conn_id = subscriber_conn_id
        self.subscriber_database = subscriber_database

    def execute(self, context: Context) -> dict[str, Any]:
        hook = replication_hook(self.subscriber_conn_id, self.subscriber_database)
        result = hook.drop_subscription(self.subscription)
        return {
            "subscription": self.subscription,
            "dropped": result.dropped,
            "slot_left_behind": result.slot_left_behind,
            "sync_slots_left_behind": list(result.sync_slots_left_behind),
            "reason": result.reason,
        }
