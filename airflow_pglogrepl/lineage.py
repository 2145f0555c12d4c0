"""Moved to ``airflow_pglogrepl.operators.lineage``: this path warns and gives that module."""

from airflow_pglogrepl._moved import alias

alias(__name__)
