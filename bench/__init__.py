"""Benchmarks (not tests): each module runs on its own, see docs/benchmarks.md."""
