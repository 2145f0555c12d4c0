"""Public testing API: throwaway PostgreSQL clusters on loopback (``pgcluster``) and polling
(``wait``), for tests of DAGs built with this provider, and for this project's own suite, demo
and benchmarks. It ships in the wheel on purpose (docs/testing.md); the project's other test
helpers live in tests/support and do not."""
