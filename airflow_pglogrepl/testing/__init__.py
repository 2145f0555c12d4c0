"""Throwaway PostgreSQL clusters and helpers shared by the tests, the demo and bench/."""
