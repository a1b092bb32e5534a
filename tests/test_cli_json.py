"""Machine-readable doors: --json on compile / targets / list / verify / inspect, the documented exit codes,
--precision, and the API taking the CLI's option names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aotforge.compiler.benchmark import BenchOptions
from aotforge.compiler.cli import main
from aotforge.compiler.options import BuildOptions
from aotforge.core.errors import EXIT_CODES, EXIT_INTEGRITY, EXIT_INTERNAL, OptionsError
from tests.test_bench import tiny_model
from tests.test_errors import invoke_cli


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("json")
    proc = invoke_cli(
        "compile", str(tiny_model(tmp / "tiny.onnx")), "-t", "onnxruntime", "-o", str(tmp / "out"),
        "--precision", "int8-dynamic", "--tolerance", "0.5", "--bench-seconds", "0.2", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_compile_json_names_the_artifact_and_its_figures(compiled: dict) -> None:
    assert Path(compiled["path"]).is_dir() and (compiled["name"], compiled["version"]) == ("tiny", 1)
    assert compiled["target"] == "onnxruntime" and compiled["passes"][-1] == "int8-dynamic"
    assert compiled["validation"]["passed"] and compiled["benchmark"]["p50_ms"] > 0
    assert len(compiled["manifest_sha256"]) == 64 and "manifest.json" not in compiled["files"]


def test_targets_inspect_verify_list_json(compiled: dict, tmp_path: Path) -> None:
    rows = json.loads(invoke_cli("targets", "--json").stdout)
    assert {r["name"] for r in rows} == {"tvm", "onnxruntime", "tensorrt", "neuron"}
    assert next(r for r in rows if r["name"] == "onnxruntime")["available"] is True
    assert json.loads(invoke_cli("inspect", compiled["path"], "--json").stdout)["name"] == "tiny"
    ok = json.loads(invoke_cli("verify", compiled["path"], "--json").stdout)
    assert ok["ok"] and ok["manifest_sha256"] == compiled["manifest_sha256"] and ok["signature"] == "unsigned"
    copy = tmp_path / "copy"
    shutil.copytree(compiled["path"], copy)
    (copy / "model.onnx").write_bytes(b"!" + (copy / "model.onnx").read_bytes())
    bad = invoke_cli("verify", str(copy), "--json")
    assert bad.returncode == EXIT_INTEGRITY and json.loads(bad.stdout)["ok"] is False
    reg = str(tmp_path / "reg")
    assert invoke_cli("push", compiled["path"], "--registry", reg).returncode == 0
    (entry,) = json.loads(invoke_cli("list", "--registry", reg, "--json").stdout)
    assert (entry["ref"], entry["target"], entry["aliases"]) == ("tiny:1", "onnxruntime", [])


def test_exit_codes_are_in_help_and_a_bug_is_exit_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    help_text = CliRunner().invoke(main, ["--help"]).output
    for code, meaning in EXIT_CODES.items():
        assert f"{code}  {meaning.split(' (')[0]}" in help_text
    assert "_AOTFORGE_COMPLETE=bash_source aotforge" in help_text

    def boom(_path: Path) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("aotforge.artifacts.manifest.read_manifest", boom)
    result = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert result.exit_code == EXIT_INTERNAL and "internal error: ZeroDivisionError" in result.output


def test_api_takes_the_cli_option_names() -> None:
    o = BuildOptions.from_dict(
        {"bench_seconds": 2, "precision": "int4", "target_opt": ["mcpu=znver4"], "pass_opt": ["int8.method=minmax"],
         "input_range": ["ids=0:99"], "no_bench": True, "backend_deadline": 60, "tune_trials": 8}
    )  # fmt: skip
    assert o.benchmark.runs == BenchOptions(max_seconds=2.0) and o.benchmark.bench is False
    assert o.isolation.backend_deadline_s == 60
    assert o.passes.names[-1] == "weight-only" and o.target_options == {"mcpu": "znver4", "tune_trials": "8"}
    assert o.passes.params == {"int8": {"method": "minmax"}} and o.frontend.input_ranges == {"ids": (0.0, 99.0)}
    with pytest.raises(OptionsError, match="both set the precision"):
        BuildOptions.from_dict({"passes": ["O1", "fp16"], "precision": "int8"})
    with pytest.raises(OptionsError, match="unknown precision"):
        BuildOptions.from_dict({"precision": "int3"})
