"""Helpers the tests share, in one place that does not ship in the wheel.

``pgoutput_encoder`` builds pgoutput messages from the documented layout; ``decoding_text``
decodes test_decoding's text rows into the same records pgoutput gives (the live tests compare
the two); ``sources`` is a source database of its own; ``drain`` creates typed tables, runs
drains and reads sources and lakes back; ``snapshot`` re-snapshots tables into a lake;
``airflow`` is the isolated Airflow (environment, connections, CLI, DAG runs, XComs, a stand-in
TaskInstance); ``cutover`` is the publisher/subscriber pair of the cutover toolkit's tests;
``preflight`` builds catalog facts by hand; ``wal`` places a commit record right after a WAL
page's header; ``silent_decode`` writes a transaction a walsender decodes for seconds without
sending anything; ``paths`` says where the tests and the repository are. The throwaway clusters
the tests, the demo and the benchmarks start are public testing API, in
``airflow_pglogrepl.testing``.
"""
