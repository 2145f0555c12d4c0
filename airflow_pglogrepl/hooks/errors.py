"""Moved to ``airflow_pglogrepl.hooks.pg.errors``: this path warns and gives that module."""

from typing import TYPE_CHECKING

from airflow_pglogrepl._moved import alias

if TYPE_CHECKING:  # what type checkers see of the old path: the new module's names
    from airflow_pglogrepl.hooks.pg.errors import *  # noqa: F403

alias(__name__)
