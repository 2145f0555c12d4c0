"""The Airflow Assets of the provider's operators: a lake is one Asset, known by its URI.

The drain and the snapshot name their lake among their ``outlets`` by default: Airflow emits
an event of that Asset after each of their successful runs (its extra says what the run did),
and a DAG scheduled on the Asset runs after them. One lake is one Asset however its URI is
spelled.
"""

from __future__ import annotations

import os

from airflow.sdk import Asset


def lake_asset(lake_root: str) -> Asset:
    """The Asset a lake is known by: its URI (``file://`` + absolute path for local paths). A
    URI with credentials in it is refused (it would be in every Asset event)."""
    from airflow_pglogrepl.hooks.object_store import check_lake_uri
    from airflow_pglogrepl.lake.storage import canonical

    check_lake_uri(lake_root)
    uri = canonical(lake_root) if "://" in lake_root else f"file://{os.path.abspath(lake_root)}"
    return Asset(uri=uri)
