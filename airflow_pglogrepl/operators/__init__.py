"""Operators: orchestrate replication steps by calling the hook; they compose no SQL."""
