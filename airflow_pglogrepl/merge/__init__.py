"""The merge: each table's changes since its state, reduced to their net effect and applied to
``state/`` as one Delta version a table.

``materialize`` chooses per table: ``arrow`` merges a small batch without a JVM (Arrow and
delta-rs), ``reduce`` computes the net change on Spark (a keyed table's through the lives of its
rows, ``lineage``) and ``materialize`` applies it with Spark's ``MERGE``. Storage (the tables,
their commits and schemas) is ``lake``'s; this package only reads the changelog and writes states
through it.
"""
