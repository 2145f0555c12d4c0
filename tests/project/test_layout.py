"""The package's shape, held where it is and let only improve (issue 29's ratchet): modules no
longer than 500 lines and functions no longer than 80 (a newcomer reads either in one sitting),
folders that import downward, no import circle, no more repeated code than today. Each
allow-list below names what is wrong today; a change that mends an entry must remove it, and
one that adds an entry fails here, naming it."""

from __future__ import annotations

import ast

from tests.support.layout import (
    PACKAGE,
    import_circles,
    modules,
    repeated_blocks,
    unmirrored,
    upward_imports,
)

MAX_LINES = 500
MAX_FUNCTION_LINES = 80

# Modules longer than MAX_LINES today, each with the length it may not grow past.
LONG_MODULES: dict[str, int] = {}

# Imports that go up the layers (tests/support/layout.py: LAYERS) today, both for type checking
# only: an error that holds a preflight report, a root module that serves the operators
# (metrics).
UPWARD_IMPORTS = {
    ("exceptions.objects", "preflight.report"),
    ("metrics", "models.records"),
}

# Places where a run of 5 code lines (docstrings, comments and imports left out) that is found in
# more than one place starts: a new copy of a repeated run adds one, as a new repeated run adds two.
REPEATED_PLACES = 102


def _short(module: str) -> str:
    return module.removeprefix(PACKAGE.name + ".")


def test_modules_stay_short() -> None:
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in modules()}
    too_long = {name: n for name, n in lengths.items() if n > LONG_MODULES.get(name, MAX_LINES)}
    assert not too_long, (
        f"longer than {MAX_LINES} lines (or than its allowance in LONG_MODULES): {too_long}; "
        "split the module by concept"
    )
    mended = sorted(name for name in LONG_MODULES if lengths.get(name, 0) <= MAX_LINES)
    assert not mended, (
        f"now {MAX_LINES} lines or fewer (or gone): remove {mended} from LONG_MODULES"
    )
    shrunk = {name: lengths[name] for name, limit in LONG_MODULES.items()
              if MAX_LINES < lengths.get(name, 0) < limit}  # fmt: skip
    assert not shrunk, f"shorter now: lower their allowances in LONG_MODULES to {shrunk}"


def test_functions_stay_short() -> None:
    """A function's lines from its ``def`` to its last line (decorators left out)."""
    too_long = {}
    for name, path in modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long[f"{_short(name)}:{node.name}"] = length
    assert not too_long, (
        f"functions longer than {MAX_FUNCTION_LINES} lines: {too_long}; split each into the "
        "steps it takes, each named for what it does"
    )


def test_folders_import_downward() -> None:
    found = {(_short(a), _short(b)) for a, b in upward_imports()}
    new = sorted(found - UPWARD_IMPORTS)
    assert not new, (
        f"imports up the layers (tests/support/layout.py LAYERS): {new}; move what is imported "
        "down, next to what imports it, or to a module both can import"
    )
    gone = sorted(UPWARD_IMPORTS - found)
    assert not gone, f"no longer imported upward: remove {gone} from UPWARD_IMPORTS"


def test_no_module_imports_itself_through_others() -> None:
    """An import circle makes a reader climb back into a module they left, and breaks the first
    time one module of it is imported first. Imports for type checking only are not counted;
    an import inside a function is: it is a dependency all the same."""
    circles = [[_short(m) for m in circle] for circle in import_circles()]
    assert not circles, (
        f"modules that import each other when they run: {circles}; move what both need into a "
        "module of its own below them, or hand the lower one what it needs"
    )


def test_no_more_repeated_code_than_before() -> None:
    repeated = repeated_blocks()
    places = sorted(f"{_short(m)}:{line}" for found in repeated.values() for m, line in found)
    assert len(places) <= REPEATED_PLACES, (
        f"{len(places)} places start a run of 5 code lines found elsewhere too (REPEATED_PLACES "
        f"is {REPEATED_PLACES}); give the repeated code one home. Where they are: {places}"
    )
    assert len(places) == REPEATED_PLACES, (
        f"fewer repeats now ({len(places)}): lower REPEATED_PLACES to match"
    )


def test_the_architecture_page_names_modules_that_exist() -> None:
    """docs/architecture.md tells a newcomer where each stage is: a module it names that moved
    or went away would send them to nothing."""
    import re

    from tests.support.paths import REPO

    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\b((?:[a-z_]+/)+[a-z_]+\.py)\b", text))
    assert len(named) > 15, named
    missing = sorted(
        p
        for p in named
        if not (REPO / "airflow_pglogrepl" / p).is_file() and not (REPO / p).is_file()
    )
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


# Modules with logic and no test module at their mirrored path (tests/README.md): tested only
# through others today. A test module at the mirrored path takes its module off this list.
UNMIRRORED: set[str] = set()


def test_tests_mirror_the_package() -> None:
    found = unmirrored()
    assert not found - UNMIRRORED, (
        f"modules with no test module at their mirrored path: {sorted(found - UNMIRRORED)}; "
        f"add tests/<folder>/test_<module>.py"
    )
    assert not UNMIRRORED - found, f"mirrored now: take {sorted(UNMIRRORED - found)} off UNMIRRORED"
