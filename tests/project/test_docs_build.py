"""The documentation site builds with ``mkdocs build --strict`` and documents every public module.

Strict mode turns every warning into a failure: a page missing from the nav's files, a broken
link or anchor between pages, a ``:::`` reference mkdocstrings cannot resolve.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

DOCUMENTED_PACKAGES = ("operators", "sensors", "triggers")
# mkdocs, mkdocs-material and mkdocstrings-python (which installs mkdocstrings_handlers).
TOOLS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built into a temporary directory; the build's output is the failure message."""
    missing = [name for name in TOOLS if importlib.util.find_spec(name) is None]
    assert not missing, (
        f"documentation tools missing: {missing}. Fix: pip install -e '.[dev]' (the dev extra "
        f"pins mkdocs, mkdocs-material and mkdocstrings[python])"
    )
    target = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(REPO / "mkdocs.yml"), "--site-dir", str(target)],
        capture_output=True,
        text=True,
        cwd=REPO,
        # Material prints a banner about MkDocs 2.0 on every build; it is not a build warning.
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, (
        f"mkdocs build --strict failed (exit {result.returncode}):\n"
        f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    )
    return target


def test_site_builds_strictly(site: Path) -> None:
    for page in (
        "index.html",
        "concepts/index.html",
        "cutover/index.html",
        "troubleshooting/index.html",
        "drain/index.html",
        "benchmarks/index.html",
    ):
        assert (site / page).is_file(), f"{page} was not built"


def test_the_architecture_picture_is_a_diagram_the_theme_draws(site: Path) -> None:
    """Material draws a ``<pre class="mermaid">`` block as a diagram (mermaid.js, loaded when
    the page opens); a plain code block would show its source instead."""
    page = (site / "architecture" / "index.html").read_text()
    assert '<pre class="mermaid"><code>flowchart LR' in page
    assert "pipeline/drain.py" in page and "changelog/columnar.py" in page


def public_modules(package: str) -> list[str]:
    directory = REPO / "airflow_pglogrepl" / package
    return sorted(
        f"airflow_pglogrepl.{package}.{path.stem}"
        for path in directory.glob("*.py")
        if not path.stem.startswith("_")
    )


@pytest.mark.parametrize("package", DOCUMENTED_PACKAGES)
def test_reference_covers_every_public_module(site: Path, package: str) -> None:
    """Each module under operators/, sensors/ and triggers/ has its section, and each of its
    operators, sensors and triggers is documented there (a public class needs a docstring)."""
    page = (site / "reference" / package / "index.html").read_text()
    modules = public_modules(package)
    assert modules, f"no modules in airflow_pglogrepl/{package}"
    for module in modules:
        assert f'id="{module}"' in page, f"{module} is missing from reference/{package}.md"
        source = (REPO / Path(*module.split("."))).with_suffix(".py").read_text()
        for line in source.splitlines():
            if line.startswith("class ") and not line.startswith("class _"):
                name = line.removeprefix("class ").split("(")[0].split(":")[0].strip()
                if not name.endswith(("Operator", "Sensor", "Trigger")):
                    continue
                assert f'id="{module}.{name}"' in page, f"{module}.{name} is not documented"
