"""Every build ends in the one tail (``compiler/build_tail.py``): the manifest is made in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import aotforge

PACKAGE = Path(aotforge.__file__).resolve().parent


def _constructions(path: Path, name: str) -> list[str]:
    """Where ``path`` calls ``name(...)`` (a class constructed), as ``file:function``."""
    found = []
    for func in ast.walk(ast.parse(path.read_text())):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                    found.append(f"{path.relative_to(PACKAGE).as_posix()}:{func.name}")
    return found


def test_the_manifest_is_made_in_one_place() -> None:
    """``make_manifest`` is the one constructor call: a build, a bundle's draft and a direct cache hit (which
    reads a stored one back with ``Manifest.from_dict``) all go through it."""
    made = sorted({c for path in PACKAGE.rglob("*.py") for c in _constructions(path, "Manifest")})
    assert made == ["compiler/build_tail.py:make_manifest"]
