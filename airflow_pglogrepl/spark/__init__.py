"""Spark applications (drain, snapshot) and the sink they write; pyspark is imported lazily."""
