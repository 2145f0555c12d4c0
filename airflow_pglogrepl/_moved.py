"""Old import paths of modules that moved to the drain pipeline's new layout, and old names of
renamed objects (docs and DAGs written against either keep working for a release).

A module that moved whole is listed in ``MOVED`` and leaves a one-line module at its old path,
``alias(__name__)``: importing the old path returns the very module object of the new one, so
identity, ``isinstance`` and ``monkeypatch.setattr`` on either name reach the same code, and a
``DeprecationWarning`` that names the new path points at the line that imported the old one.
The test suite turns such a warning into an error in the package's own code (pyproject's
``filterwarnings``): only users' code may use an old path. A renamed object keeps its old
name through the module's ``__getattr__`` (``renamed``), which warns the same way.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable

# Old path -> new path of every module that moved. Code that walks the package's modules skips
# the old paths (each is the module at its new path again).
MOVED = {
    "airflow_pglogrepl.hooks.errors": "airflow_pglogrepl.hooks.pg.errors",
    "airflow_pglogrepl.hooks.lsn_adapters": "airflow_pglogrepl.hooks.pg.lsn_adapters",
    "airflow_pglogrepl.lake.columnar": "airflow_pglogrepl.changelog.columnar",
    "airflow_pglogrepl.spark.drain": "airflow_pglogrepl.pipeline.drain",
    "airflow_pglogrepl.spark.overlap": "airflow_pglogrepl.pipeline.overlap",
    "airflow_pglogrepl.lake.batch": "airflow_pglogrepl.changelog.rows",
    "airflow_pglogrepl.lake.changelog": "airflow_pglogrepl.changelog.columns",
    "airflow_pglogrepl.lake.temporal": "airflow_pglogrepl.changelog.temporal",
    "airflow_pglogrepl.lake.types": "airflow_pglogrepl.changelog.types",
    "airflow_pglogrepl.lake.arrow_merge": "airflow_pglogrepl.merge.arrow",
    "airflow_pglogrepl.lake.materialize": "airflow_pglogrepl.merge.materialize",
    "airflow_pglogrepl.lake.reduce": "airflow_pglogrepl.merge.reduce",
    "airflow_pglogrepl.hooks.fence_guard": "airflow_pglogrepl.hooks.pg.fence_guard",
    "airflow_pglogrepl.hooks.secret_statements": "airflow_pglogrepl.hooks.pg.secret_statements",
    "airflow_pglogrepl.hooks.records": "airflow_pglogrepl.models.records",
    "airflow_pglogrepl.lineage": "airflow_pglogrepl.operators.lineage",
    "airflow_pglogrepl.preflight.facts": "airflow_pglogrepl.models.facts",
    "airflow_pglogrepl.sensors.probes": "airflow_pglogrepl.triggers.probes",
    "airflow_pglogrepl.sensors.verdicts": "airflow_pglogrepl.models.verdicts",
}


def alias(old: str) -> None:
    """Make the module ``old`` (the caller, being imported) the module it moved to."""
    new = MOVED[old]
    warnings.warn(
        f"{old} moved to {new}: import it from there; the old path goes in a later release",
        DeprecationWarning,
        # past this function and the old module's body; warnings skips the import system's
        # frames, so the warning names the line that imported the old path
        stacklevel=3,
    )
    sys.modules[old] = importlib.import_module(new)


def warn_caller(message: str) -> None:
    """A ``DeprecationWarning`` attributed to the first frame outside this package and Airflow:
    the DAG line that used an old name, however many of our and Airflow's frames (an operator's
    ``__init__`` and its base classes, Airflow's wrappers of it) stand in between."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in (
        "airflow_pglogrepl",
        "airflow",
    ):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level + 1)


def renamed(module: str, names: dict[str, str]) -> Callable[[str], object]:
    """A module's ``__getattr__`` for names that were renamed in it: ``old`` returns the object
    now called ``names[old]``, with a ``DeprecationWarning`` naming the new name (the object is
    the same, so ``except`` and ``isinstance`` on the old name still match)."""

    def old_name(name: str) -> object:
        new = names.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(
            f"{module}.{name} is now {new}: use the new name; the old one goes in a later release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(sys.modules[module], new)

    return old_name
