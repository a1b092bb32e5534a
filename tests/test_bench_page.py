"""docs/benchmarks.md is generated from the benches' result files (tools/bench_page.py), never typed by hand."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

from tests.conftest import ROOT


def _tool(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "tools"))  # the tools import their neighbours by name, as when run as scripts
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # a dataclass looks its module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "tools"))


bench_page = _tool("bench_page")
bench_record = _tool("bench_record")


def test_the_committed_page_is_what_the_result_files_render() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page == bench_page.render(), "docs/benchmarks.md differs from its result files: run make bench-page"


def test_a_figure_keeps_its_spread_and_a_bench_not_run_says_how_to_run_it(tmp_path: Path) -> None:
    figure = bench_record.figure([3.0, 1.0, 2.0, None])
    assert figure == {"median": 2.0, "min": 1.0, "max": 3.0, "rounds": [3.0, 1.0, 2.0]}
    run = bench_record.start({"rounds": 3, "work": tmp_path})
    assert run["machine"]["cpu_model"] and run["command"].startswith("python ") and len(run["load_before"]) == 3
    rows = [["tvm", figure], ["ort", "not timed: no SDK"]]
    tables = [bench_record.table("tiny, timed at batch=1", ("runtime", "p50 ms"), rows)]
    bench_record.write(tmp_path / "models.json", "models", run, tables, results=[])
    record = json.loads((tmp_path / "models.json").read_text())
    assert record["schema_version"] == 1 and len(record["run"]["load_after"]) == 3

    page = bench_page.render(tmp_path)
    assert "| tvm | 2.00 (1.00–3.00, 3 rounds) |" in page
    assert "| ort | not timed: no SDK |" in page
    assert run["machine"]["cpu_model"] in page and run["date"] in page
    assert "Not run yet: `make bench-generation`." in page and "Not run yet: `make bench-speculative`." in page
    assert "Not run yet: `make bench-models`." not in page


def test_a_run_names_the_kernels_isa_extensions_this_cpu_has_and_the_page_shows_them(tmp_path: Path) -> None:
    """A VM's model name ("AMD EPYC") is the same on CPUs with and without AVX-512 VNNI; the flags tell them apart."""
    from aotforge.core.cpu_flags import cpu_flags

    run = bench_record.start({})
    flags = run["machine"]["cpu_flags"]
    assert flags == [f for f in bench_record.KERNEL_FLAGS if f in cpu_flags()]
    bench_record.write(tmp_path / "models.json", "models", run, [], results=[])
    cpu_row = next(line for line in bench_page.render(tmp_path).splitlines() if line.startswith("| CPU |"))
    assert all(f in cpu_row for f in flags) and (bool(flags) or "none of avx2 / avx512" in cpu_row)
    run["machine"].pop("cpu_flags")  # a run recorded before the flags were: its row says nothing of them
    bench_record.write(tmp_path / "models.json", "models", run, [], results=[])
    cpu_row = next(line for line in bench_page.render(tmp_path).splitlines() if line.startswith("| CPU |"))
    assert cpu_row.endswith("GiB |")
