"""The S3 API server of the tests: ``airflow_pglogrepl.testing.s3``, shared with the demo and
the benchmarks."""

from airflow_pglogrepl.testing.s3 import S3Server, backdate, configure_spark

__all__ = ["S3Server", "backdate", "configure_spark"]
