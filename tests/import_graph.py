"""The import graph of a package read from its source with ``ast``: which file imports which, and the circles.

Every import counts, wherever it stands: module level, inside a function, under ``if TYPE_CHECKING:``
(a type-only circle still ties two files together). So do the dotted paths in module-level name tables
(``TARGETS = {"tvm": "aotforge.targets.tvm_target:TvmTarget"}``) and literal ``import_module("...")``
arguments, which is how the lazy tables load what they name. Importing ``a.b.c`` also runs ``a/__init__.py``
and ``a/b/__init__.py``; that implicit step is not an arrow, or every package would be a circle.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

#: A string naming a module (``pkg.mod``) or one of its attributes (``pkg.mod:Name``).
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?")


@dataclasses.dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line`` of the source's file."""

    source: str
    target: str
    line: int


def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``package_dir`` (the package's own folder)."""
    files: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(package_dir: Path) -> dict[str, list[Edge]]:
    """Module -> the edges to other modules of the same package, in source order."""
    files = module_files(package_dir)
    return {name: list(_edges(name, path, files)) for name, path in files.items()}


def _edges(name: str, path: Path, modules: dict[str, Path]) -> Iterator[Edge]:
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    for node, dotted, exact in _imported_names(tree, name, is_package):
        target = (dotted if dotted in modules else None) if exact else _resolve(dotted, modules)
        if target is not None and target != name:
            yield Edge(name, target, node.lineno)


def _imported_names(tree: ast.Module, name: str, is_package: bool) -> Iterator[tuple[ast.stmt | ast.expr, str, bool]]:
    """(node, the most specific dotted name it may load, whether only that exact module counts) per import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node, alias.name, False) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, name, is_package)
            # ``from a.b import c`` loads the module a.b.c if there is one, else takes c from a.b.
            yield from ((node, f"{base}.{alias.name}", False) for alias in node.names)
        elif isinstance(node, ast.Call) and _is_import_call(node):
            yield from ((node, arg.value, True) for arg in node.args[:1] if isinstance(arg, ast.Constant))
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Dict):
            for value in node.value.values:
                if isinstance(value, ast.Constant) and isinstance(value.value, str) and _DOTTED.fullmatch(value.value):
                    # A table string must name a module exactly: "aotforge.key.pem" is a file name.
                    yield value, value.value.partition(":")[0], True


def _is_import_call(node: ast.Call) -> bool:
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return called in ("import_module", "__import__")


def _absolute(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The module a ``from X import`` names, with relative levels resolved against ``name``."""
    if not node.level:
        return node.module or ""
    parts = name.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - node.level + 1]
    return ".".join([*anchor, *([node.module] if node.module else [])])


def _resolve(dotted: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``dotted`` that is a module of the package (None: not ours)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def circles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for edge in graph.get(node, []):
            if edge.target not in index:
                visit(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            group = []
            while (member := stack.pop()) != node:
                group.append(member)
            if group:
                found.append(sorted([node, *group]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def describe_circle(graph: dict[str, list[Edge]], members: list[str]) -> str:
    """The arrows inside one circle, ``a -> b (lines 12, 40)`` one per line, for a failure message."""
    inside = set(members)
    lines: dict[tuple[str, str], list[int]] = {}
    for member in members:
        for e in graph[member]:
            if e.target in inside:
                lines.setdefault((e.source, e.target), []).append(e.line)
    arrows = [f"  {a} -> {b} (lines {', '.join(map(str, sorted(set(n))))})" for (a, b), n in sorted(lines.items())]
    return f"circle of {len(members)}: {', '.join(members)}\n" + "\n".join(arrows)
