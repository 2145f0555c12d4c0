"""Hooks: the only modules that speak SQL to PostgreSQL."""
