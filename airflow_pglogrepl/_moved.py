"""Old import paths of modules that moved to the drain pipeline's new layout (docs and DAGs
written against the old paths keep working for a release).

A module that moved whole leaves a one-line module at its old path, ``alias(__name__, "new")``:
importing the old path returns the very module object of the new one, so identity, ``isinstance``
and ``monkeypatch.setattr`` on either name reach the same code, and a ``DeprecationWarning`` that
names the new path points at the line that imported the old one. The test suite turns such a
warning into an error in the package's own code (pyproject's ``filterwarnings``): only users'
code may use an old path.
"""

from __future__ import annotations

import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
    """Make the module ``old`` (the caller, being imported) the module ``new``."""
    warnings.warn(
        f"{old} moved to {new}: import it from there; the old path goes in a later release",
        DeprecationWarning,
        # past this function and the old module's body; warnings skips the import system's
        # frames, so the warning names the line that imported the old path
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)
