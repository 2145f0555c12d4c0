"""Moved to ``airflow_pglogrepl.triggers.probes``: this path warns and gives that module."""

from airflow_pglogrepl._moved import alias

alias(__name__)
