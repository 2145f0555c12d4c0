"""The changelog: the column contract and the row builder, between the decoder and the lake.

``columns`` is the contract every reader relies on (the metadata columns, the key and replica
identity recorded in the schema), ``types`` maps PostgreSQL's types to Arrow's (``temporal``
their dates and times), and ``rows`` gathers a table's decoded changes into a typed Arrow table
of that shape. Storing the tables is ``airflow_pglogrepl.lake``'s.
"""
