"""Spark applications (drain, snapshot) and the lake they write; pyspark is imported lazily."""
