"""Helpers the tests share, in one place that does not ship in the wheel.

``pgoutput_encoder`` builds pgoutput messages from the documented layout; ``decoding_text``
decodes test_decoding's text rows into the same records pgoutput gives (the live tests compare
the two); ``drain`` creates typed tables and reads sources and lakes back. The throwaway
clusters the tests, the demo and the benchmarks start are public testing API, in
``airflow_pglogrepl.testing``.
"""
