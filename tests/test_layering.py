"""The layers of aotforge hold: no import circle between files, no import from a lower layer up.

From the bottom: ``aotforge.core`` -> ``aotforge.passes`` and ``aotforge.targets`` (never each other) ->
``aotforge.runtime`` (the engine over a target's model runner) -> ``aotforge.artifacts`` -> ``aotforge.compiler``
(frontends, the build line, the CLI); ``aotforge.server`` (the HTTP server over the runtime) sits beside the CLI,
which imports it. The graph is read
from the source (``tests/import_graph.py``), so a circle hidden in a function body or behind
``TYPE_CHECKING`` shows up too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import aotforge
from tests.conftest import ROOT
from tests.import_graph import Edge, circles, describe_circle, import_graph

PACKAGE = Path(aotforge.__file__).resolve().parent
GRAPH = import_graph(PACKAGE)

#: (layer, the packages it must never import, why): a module of ``layer`` may still import its own layer.
RULES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("aotforge.core", ("aotforge",), "the core is the ground floor: it imports nothing else of aotforge"),
    ("aotforge.passes", ("aotforge.targets", "aotforge.compiler"), "passes never import targets or the build driver"),
    (
        "aotforge.targets",
        ("aotforge.passes", "aotforge.compiler"),
        "targets never import passes, the CLI or the build driver",
    ),
    ("aotforge.artifacts", ("aotforge.passes", "aotforge.compiler"), "artifacts never import passes or the builder"),
    (
        "aotforge.runtime",
        ("aotforge.artifacts", "aotforge.compiler"),
        "the runtime runs a target's model runner; the artifacts floor loads artifacts into it, never the reverse",
    ),
    *(
        (layer, ("aotforge.server",), "the server is a top layer beside the CLI: nothing below it imports it")
        for layer in ("aotforge.core", "aotforge.passes", "aotforge.targets", "aotforge.artifacts", "aotforge.runtime")
    ),
    ("aotforge.server", ("aotforge.compiler",), "the server runs on the runtime, never the build driver or the CLI"),
)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _where(edge: Edge) -> str:
    from tests.import_graph import module_files

    path = module_files(PACKAGE)[edge.source].relative_to(PACKAGE.parent)
    return f"{path}:{edge.line} imports {edge.target}"


def test_no_import_circle_between_files() -> None:
    found = circles(GRAPH)
    assert not found, "import circles:\n" + "\n".join(describe_circle(GRAPH, c) for c in found)


@pytest.mark.parametrize(("layer", "forbidden", "why"), RULES, ids=[rule[0] for rule in RULES])
def test_no_import_breaks_a_layer_rule(layer: str, forbidden: tuple[str, ...], why: str) -> None:
    broken = [
        _where(e)
        for module, edges in GRAPH.items()
        if _within(module, layer)
        for e in edges
        if not _within(e.target, layer) and any(_within(e.target, f) for f in forbidden)
    ]
    assert not broken, f"{why}:\n" + "\n".join(broken)


def test_the_lazy_name_tables_are_edges() -> None:
    """What ``get_target``, ``make_pass`` and ``aotforge.<name>`` import by name are edges (a target's generative
    module, which ``Target.generative`` imports by name, is in its own folder: tests/test_target_contract.py)."""
    from aotforge.passes import PASSES
    from aotforge.targets import TARGETS

    tables = {
        "aotforge.targets": TARGETS.values(),
        "aotforge.passes": PASSES.values(),
        "aotforge": aotforge._API.values(),
    }
    for module, dotted in tables.items():
        named = {d.partition(":")[0] for d in dotted}
        assert named <= {e.target for e in GRAPH[module]}, module


def test_the_walker_finds_hidden_circles(tmp_path: Path) -> None:
    """Function-level, ``TYPE_CHECKING`` and table imports all make arrows; a parent package does not."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('TABLE = {"c": "pkg.sub.c:C", "file": "pkg.key.pem"}\n')
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n")
    (pkg / "sub" / "__init__.py").write_text("from pkg.sub import c\n")
    (pkg / "sub" / "c.py").write_text("import importlib\nfrom .. import a\nimportlib.import_module('pkg')\n")
    graph = import_graph(pkg)
    assert circles(graph) == [["pkg", "pkg.sub.c"], ["pkg.a", "pkg.b"]]
    assert {e.target for e in graph["pkg"]} == {"pkg.sub.c"}  # the file name is no module
    assert {e.target for e in graph["pkg.sub.c"]} == {"pkg.a", "pkg"}
    assert {e.target for e in graph["pkg.sub"]} == {"pkg.sub.c"}


def test_ruff_bans_bare_top_level_imports(tmp_path: Path) -> None:
    """The lint rule in pyproject.toml fires on ``compiler.`` / ``targets.`` / ... and lets ``aotforge.`` pass."""
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.skip(f"ruff is not installed beside {sys.executable} (pip install -e '.[dev]')")
    scratch = tmp_path / "scratch.py"
    banned = ("compiler", "targets", "passes", "artifacts", "core")
    lines = [f"import {name}.x" for name in banned] + [f"from aotforge.{name} import x" for name in banned]
    scratch.write_text("\n".join(lines) + "\n")
    command = [str(ruff), "check", "--config", str(ROOT / "pyproject.toml"), "--select", "TID251"]
    run = subprocess.run([*command, "--output-format", "json", str(scratch)], capture_output=True, text=True)
    found = json.loads(run.stdout)
    assert [(f["code"], f["location"]["row"]) for f in found] == [("TID251", row) for row in range(1, 6)]
