"""Reads the package's shape for tests/project/test_layout.py: module sizes, the imports between
its folders, and the blocks of code repeated across it (all with ``ast``, nothing imported)."""

from __future__ import annotations

import ast
import hashlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from tests.support.paths import REPO

PACKAGE = REPO / "airflow_pglogrepl"

# The layers, bottom to top: a module may import its own layer and those below it. The plain
# records (models) sit under everything that uses them, the statements (hooks.pg) under the
# lake and the Spark applications, the changelog's contract and row builder (changelog) between
# the decoder (pgoutput) and the storage (lake), the roles (hooks, triggers, sensors, operators)
# on top.
LAYERS = ("root", "models", "preflight", "hooks.pg", "pgoutput", "changelog", "lake", "merge",
          "pipeline", "spark", "hooks", "triggers", "sensors", "operators", "testing")  # fmt: skip


def modules() -> Iterator[tuple[str, Path]]:
    """``(dotted name, path)`` of every module of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def layer(module: str) -> str:
    """The layer of a dotted module name (a module at the package's root is ``root``)."""
    parts = module.split(".")[1:]
    if parts[:2] == ["hooks", "pg"]:
        return "hooks.pg"
    return parts[0] if parts and parts[0] in LAYERS else "root"


def imports(module: str, path: Path) -> set[str]:
    """The package's modules ``module`` imports: at the top, inside functions or for type
    checking alike (a lazy import is still a dependency)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    known = {name for name, _ in modules()}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known)
    from airflow_pglogrepl._moved import MOVED  # an old path leads to the module it moved to

    return {MOVED.get(name, name) for name in found if name in known and name != module}


def upward_imports() -> set[tuple[str, str]]:
    """Every ``(importer, imported)`` where the imported module's layer is above the importer's
    (an old path's shim, which imports the module it moved to, imports nothing of its own)."""
    from airflow_pglogrepl._moved import MOVED

    return {
        (module, target)
        for module, path in modules()
        if module not in MOVED
        for target in imports(module, path)
        if LAYERS.index(layer(target)) > LAYERS.index(layer(module))
    }


def code_lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, text)`` of the lines that are code: stripped, without blank lines,
    comments, docstrings or imports (which repeat by nature)."""
    source = path.read_text(encoding="utf-8")
    skip: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                skip.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    lines = []
    for number, text in enumerate(source.splitlines(), 1):
        stripped = text.strip()
        if number not in skip and stripped and not stripped.startswith("#"):
            lines.append((number, stripped))
    return lines


def repeated_blocks(window: int = 5) -> dict[str, list[tuple[str, int]]]:
    """Runs of ``window`` code lines found in more than one place: a digest of the lines ->
    ``(module, first line)`` of each place (a third copy of a run adds a place)."""
    places: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for module, path in modules():
        lines = code_lines(path)
        for start in range(len(lines) - window + 1):
            text = "\n".join(t for _, t in lines[start : start + window])
            digest = hashlib.sha1(text.encode()).hexdigest()
            places[digest].append((module, lines[start][0]))
    return {digest: found for digest, found in places.items() if len(found) > 1}


def unmirrored() -> set[str]:
    """Modules with logic (a function or method) that have no test module at the mirrored
    path, ``tests/<folder>/test_<module>.py`` (a leading underscore may be kept or dropped),
    named by their path under the package. Old paths of ``MOVED`` are not modules."""
    from airflow_pglogrepl._moved import MOVED

    found: set[str] = set()
    for dotted, path in modules():
        if dotted in MOVED or path.name in ("__init__.py", "__main__.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(tree)):
            continue  # records and constants only: tested where they are used
        relative = path.relative_to(PACKAGE)
        folder = REPO / "tests" / relative.parent
        names = {f"test_{relative.stem}.py", f"test_{relative.stem.lstrip('_')}.py"}
        if not any((folder / name).is_file() for name in names):
            found.add(str(relative))
    return found
