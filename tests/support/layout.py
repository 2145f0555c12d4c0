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
# records (models) sit under everything that uses them, the statements (postgres) under the
# lake and the Spark applications, the changelog's contract and row builder (changelog) between
# the decoder (pgoutput) and the storage (lake), the roles (hooks, triggers, sensors, operators)
# on top.
LAYERS = ("root", "models", "preflight", "postgres", "pgoutput", "changelog", "lake", "merge",
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
    return parts[0] if parts and parts[0] in LAYERS else "root"


def imports(module: str, path: Path, tree: ast.Module | None = None) -> set[str]:
    """The package's modules ``module`` imports: at the top, inside functions or for type
    checking alike (a lazy import is still a dependency); from ``tree`` when given."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    known = {name for name, _ in modules()}
    found: set[str] = set()
    for node in ast.walk(tree or ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            submodules = {f"{base}.{a.name}" for a in node.names} & known
            found.update(submodules)
            if len(submodules) < len(node.names):  # a name the package itself defines
                found.add(base)

    return {name for name in found if name in known and name != module}


def runtime_imports(module: str, path: Path) -> set[str]:
    """The package's modules ``module`` imports when it runs: at the top or inside functions (a
    lazy import is still a dependency), not in an ``if TYPE_CHECKING:`` block."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            node.body = []
    return imports(module, path, tree)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_circles() -> list[list[str]]:
    """The package's modules that import each other in a loop when they run
    (``runtime_imports``): each strongly connected group of more than one module, sorted."""
    graph = {module: runtime_imports(module, path) for module, path in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(circles)


def upward_imports() -> set[tuple[str, str]]:
    """Every ``(importer, imported)`` where the imported module's layer is above the importer's."""
    return {
        (module, target)
        for module, path in modules()
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
    named by their path under the package."""
    found: set[str] = set()
    for _, path in modules():
        if path.name in ("__init__.py", "__main__.py"):
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
