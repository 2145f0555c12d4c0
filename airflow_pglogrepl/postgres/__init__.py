"""PostgreSQL statements as plain functions of a psycopg connection, without Airflow.

The Spark applications (and their executors) run outside Airflow: they call these directly,
through ``PgSource``. The Airflow hook's mixins (``hooks/slots.py`` ...) are thin shells over
the same functions, so every statement is written once and composed the same way
(``psycopg.sql.Identifier`` for names, bound values).
"""
