"""``_moved.alias``: an old module path is the new module, with a warning at the importer."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_pglogrepl._moved import MOVED
from airflow_pglogrepl.lsn import LSN
from tests.support.layout import PACKAGE, modules


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package with a module ``new`` and a shim ``old`` pointing at it, on ``sys.path``."""
    name = f"moved_{tmp_path.name.replace('-', '_')}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "new.py").write_text("class Thing:\n    pass\n")
    (root / "old.py").write_text("from airflow_pglogrepl._moved import alias\n\nalias(__name__)\n")
    monkeypatch.setitem(MOVED, f"{name}.old", f"{name}.new")
    (root / "user.py").write_text("from . import old\n")  # code written against the old path
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m.startswith(name)]:
            del sys.modules[module]


def test_the_old_path_is_the_new_module_and_warns_at_the_importer(package: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        user = importlib.import_module(f"{package}.user")
    new = importlib.import_module(f"{package}.new")
    assert user.old is new and user.old.Thing is new.Thing
    assert importlib.import_module(f"{package}.old") is new
    (warning,) = [w for w in caught if w.category is DeprecationWarning]
    assert f"{package}.old moved to {package}.new" in str(warning.message)
    assert warning.filename == user.__file__  # the line that imported the old path


def test_a_monkeypatch_through_the_old_path_reaches_the_new(
    package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module(f"{package}.old")
    monkeypatch.setattr(old, "Thing", int)
    assert importlib.import_module(f"{package}.new").Thing is int


def test_every_old_path_is_listed_and_leads_where_it_says() -> None:
    """Every shim (``alias(__name__)``) is listed in MOVED, the list the package's walkers
    (tests/test_boundary.py, tests/models/test_records.py) skip, and its old path imports as the
    module at the new one."""
    shims = {
        name
        for name, path in modules()
        if "alias(__name__)" in path.read_text(encoding="utf-8")
        and name != f"{PACKAGE.name}._moved"
    }
    assert shims == set(MOVED), "list each moved module's old path in _moved.MOVED"
    known = {name for name, _ in modules()}
    assert not set(MOVED.values()) - known, "a new path of MOVED is no module of the package"
    for old, new in MOVED.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert importlib.import_module(old) is importlib.import_module(new), old


def test_a_renamed_object_answers_to_its_old_name_with_a_warning() -> None:
    from airflow_pglogrepl import exceptions
    from airflow_pglogrepl.exceptions import lake
    from airflow_pglogrepl.hooks import object_store
    from airflow_pglogrepl.lake import snapshots
    from airflow_pglogrepl.operators import _spark, drain
    from airflow_pglogrepl.spark import session, snapshot

    olds = [(exceptions, "SinkError", "LakeMismatchError"),
            (exceptions, "SinkFromAnotherSourceError", "LakeFromAnotherSourceError"),
            (exceptions, "SinkNotEmptyError", "LakeNotEmptyError"),
            (exceptions, "SinkNotSnapshottedError", "LakeNotSnapshottedError"),
            (exceptions, "SlotAheadOfSinkError", "SlotAheadOfLakeError"),
            (lake, "SinkError", "LakeMismatchError"), (drain, "sink_asset", "lake_asset"),
            (snapshot, "SinkNotEmptyError", "LakeNotEmptyError"),
            (snapshot, "check_empty_sink", "check_empty_lake"),
            (snapshots, "check_empty_sink", "check_empty_lake"),
            (_spark, "sink_asset", "lake_asset"), (object_store, "check_sink", "check_lake_uri"),
            (session, "SINK_CONF", "LAKE_CONF")]  # fmt: skip
    for module, old, new in olds:
        with pytest.warns(DeprecationWarning, match=rf"{module.__name__}\.{old} is now {new}"):
            assert getattr(module, old) is getattr(module, new)
    with pytest.raises(AttributeError, match="has no attribute 'SinkErrror'"):
        exceptions.SinkErrror  # noqa: B018
    # an error raised under its new name is caught under its old one
    with pytest.warns(DeprecationWarning), pytest.raises(exceptions.SinkError):
        raise exceptions.LakeNotEmptyError("the lake holds commits")
    ahead = exceptions.SlotAheadOfLakeError("s", LSN(2), LSN(1), "/lake")
    with pytest.warns(DeprecationWarning, match=r"\.sink_lsn is now \.lake_lsn"):
        assert ahead.sink_lsn == LSN(1)
