"""The lake: Delta Lake tables of changes and current state, and the one writer that owns them.

``layout`` names the tables, ``delta`` holds the few Delta log operations the drain needs without a
JVM, ``window`` is the window API the drain writes through (and the crash-safety argument),
``lake`` the lake's position, owner and commit point, ``lock`` keeps writers apart, and ``cut``
finds the versions of several tables that hold the lake at one position (``txnlog`` reads a log's
app transactions), and ``replay`` gives a table's changes between two LSNs or its state as of a
position. The column contract every reader relies on, and the rows the drain writes, are
``airflow_pglogrepl.changelog``'s; merging the changelog into ``state/`` is
``airflow_pglogrepl.merge``'s."""
