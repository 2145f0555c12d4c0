"""Triggers: async pollers for deferrable sensors; no blocking I/O in run()."""
