"""``python -m airflow_pglogrepl.testing``: clusters for ``airflow dags test`` (see ``shell``)."""

from airflow_pglogrepl.testing.shell import main

raise SystemExit(main())
