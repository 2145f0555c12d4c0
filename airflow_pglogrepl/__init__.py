"""airflow-pglogrepl: orchestrate PostgreSQL logical replication from Apache Airflow.

Importing the package is cheap on purpose (DAG files are parsed often): no Airflow, psycopg or
pyspark import happens here. Import operators, sensors and hooks from their own modules.
"""

from __future__ import annotations

__version__ = "0.1.0"
