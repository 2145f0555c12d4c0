"""Where the tests and the repository are, for tests that read the project's own files."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
