"""The drain loop: one run of bounded LSN windows from the slot into the lake, on the worker or
in the Spark application's driver alike, without Spark.

``drain`` reads each window from the slot (``postgres``), decodes it (``pgoutput``, or the
columnar decoder) and writes it through the lake's window API (``lake``), then moves the slot;
``overlap`` runs a window's fetch, decode and write side by side. Merging into ``state/`` is
``merge``'s, and starting Spark is ``spark``'s.
"""
