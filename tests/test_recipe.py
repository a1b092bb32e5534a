"""Recipes: a good one fills BuildOptions, unknown keys at every level and bad types are refused by name;
CLI flags override the recipe; --calibration / --accuracy-budget reach the int8 pass."""

from __future__ import annotations

from pathlib import Path

import onnx_ir as ir
import pytest

from aotforge.compiler.options import BuildOptions, PassOptions
from aotforge.compiler.recipe import int8_shortcuts, load_recipe, recipe_options
from aotforge.core.errors import OptionsError
from tests.pass_models import mlp
from tests.test_errors import invoke_cli

GOOD = """
passes = ["O2", "int8"]
target = "onnxruntime"
tolerance = 0.2
accuracy_budget = 0.99
[pass_options.int8]
method = "percentile"
samples = 4
[target_options]
optimization_level = "all"
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(text)
    return path


def test_good_recipe_fills_build_options(tmp_path: Path) -> None:
    opts = BuildOptions.from_dict(load_recipe(_write(tmp_path, GOOD)))
    assert opts.passes.names == ("O2", "int8") and opts.target == "onnxruntime" and opts.validation.tolerance == 0.2
    assert opts.passes.params["int8"]["method"] == "percentile"
    params = int8_shortcuts(opts.passes, ("optimize", "int8"))
    assert params["int8"]["min_cosine"] == 0.99


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"pases": ["O1"]}, r"unknown key\(s\) pases; valid: accuracy_budget, calibration"),
        ({"passes": ["int8"], "pass_options": {"int8": {"methd": "minmax"}}}, r"unknown pass int8 option.*methd"),
        ({"target": "onnxruntime", "target_options": {"threads": 2}}, r"unknown .*onnxruntime option.*threads"),
        ({"passes": ["O1"], "pass_options": {"int8": {}}}, r"pass 'int8' is not in passes"),
        ({"passes": ["nope"]}, r"unknown pass 'nope'"),
    ],
)
def test_unknown_keys_rejected_by_name(data: dict, match: str) -> None:
    with pytest.raises(OptionsError, match=match):
        recipe_options(data)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"tolerance": "big"}, "key tolerance must be int or float, got str"),
        ({"passes": 3}, "key passes must be list or str"),
        ({"pass_options": {"int8": "fast"}}, "pass_options.int8 must be a table"),
        ({"passes": ["int8"], "pass_options": {"int8": {"samples": "many"}}}, "samples"),
    ],
)
def test_bad_types_rejected(data: dict, match: str) -> None:
    with pytest.raises(OptionsError, match=match):
        recipe_options(data)


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match="not valid TOML"):
        load_recipe(_write(tmp_path, "passes = ["))
    with pytest.raises(OptionsError, match="does not exist"):
        load_recipe(tmp_path / "none.toml")


def test_shortcuts_need_the_int8_pass() -> None:
    with pytest.raises(OptionsError, match=r"calibration given but no int8 pass \(int8, int8-dynamic\) is in passes"):
        int8_shortcuts(PassOptions(calibration="calib/"), ("fold",))


@pytest.mark.parametrize("passes", [("fold", "int8-dynamic"), ("int8", "int8-dynamic")])
def test_shortcuts_reach_every_int8_pass(passes: tuple[str, ...]) -> None:
    params = int8_shortcuts(PassOptions(calibration="calib/", accuracy_budget=0.995), passes)
    for name in {"int8", "int8-dynamic"} & set(passes):
        assert params[name] == {"calibration_dir": "calib/", "min_cosine": 0.995}


def test_cli_flags_override_the_recipe(tmp_path: Path) -> None:
    model = tmp_path / "mlp.onnx"
    ir.save(mlp(), model)
    recipe = _write(
        tmp_path, 'passes = ["fuse", "int8"]\ntarget = "tvm"\ntolerance = 0.2\n[pass_options.int8]\nsamples = 4\n'
    )
    proc = invoke_cli(
        "compile", str(model), "--recipe", str(recipe), "--target", "onnxruntime", "--no-bench",
        "--pass-opt", "int8.method=percentile", "--accuracy-budget", "0.9", "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    from aotforge.artifacts.manifest import read_manifest

    manifest = read_manifest(Path(proc.stdout.strip().splitlines()[-1]))
    passes = {p["name"]: p for p in manifest.passes}
    assert manifest.target.name == "onnxruntime"
    assert passes["int8"]["params"]["method"] == "percentile" and passes["int8"]["params"]["samples"] == 4
    assert passes["int8"]["params"]["min_cosine"] == 0.9


def test_cli_unknown_recipe_key_is_one_line(tmp_path: Path) -> None:
    model = tmp_path / "mlp.onnx"
    ir.save(mlp(), model)
    proc = invoke_cli("compile", str(model), "--recipe", str(_write(tmp_path, "speed = 3\n")))
    assert proc.returncode != 0 and "unknown key(s) speed" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
