"""The user's validation data: --sample-inputs FILE.npz|DIR, sample_inputs= (path or dicts), the recipe key.

The model holds a Gather whose indices are a graph input: generated ids (0..7) fall outside its
two rows, so the source model itself rejects them and only real samples can validate it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from aotforge.compiler.cli import main
from aotforge.core.errors import InputSpecError
from tests.conftest import quick_build

ROWS = 2
_T = np.zeros((ROWS, 4), np.float32)


def _gather_model(path: Path) -> Path:
    """y = table[ids] * x; the 2-row ``table`` is an input, so no vocabulary range bounds ``ids``."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"]), helper.make_node("Mul", ["rows", "x"], ["y"])],
        "gather",
        [
            helper.make_tensor_value_info("table", TensorProto.FLOAT, [ROWS, 4]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["seq"]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", 4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _sample(seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "table": rng.standard_normal((ROWS, 4)).astype(np.float32),
        "ids": rng.integers(0, ROWS, size=seq).astype(np.int64),
        "x": rng.standard_normal((seq, 4)).astype(np.float32),
    }


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return _gather_model(tmp_path / "gather.onnx")


def test_generated_inputs_rejected_by_the_source_model_name_sample_inputs(model: Path, tmp_path: Path) -> None:
    with pytest.raises(InputSpecError, match=r"source model itself fails on the generated.*--sample-inputs"):
        quick_build(model, tmp_path / "out", target="onnxruntime", dynamic=["seq=1:16:16"])


@pytest.mark.parametrize("layout", ["npz", "stacked_npz", "npz_dir", "pb_dir", "pb_sets", "dicts"])
def test_sample_inputs_validate_and_benchmark(model: Path, tmp_path: Path, layout: str) -> None:
    samples = [_sample(5, seed) for seed in range(3)]
    given = _write(layout, samples, tmp_path / "samples")
    result = quick_build(model, tmp_path / "out", target="onnxruntime", sample_inputs=given, bench=True)
    validation = result.manifest.validation
    record = validation["inputs"]
    assert record["source"] == "sample_inputs"
    expected = samples[:1] if layout in ("npz", "pb_dir") else samples
    assert record["count"] == validation["samples"] == len(expected)
    assert record["sha256"] == _digest(expected)
    if layout in ("npz", "stacked_npz"):
        assert record["file_sha256"] == hashlib.sha256(Path(given).read_bytes()).hexdigest()
    # The dim no --dynamic named takes the samples' size, and the benchmark ran there.
    assert validation["bound_dims"] == {"seq": 5}
    assert result.manifest.benchmark is not None and result.manifest.benchmark["runs"] >= 1


def test_generated_inputs_are_recorded(tmp_path: Path) -> None:
    path = tmp_path / "add.onnx"
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "a"], ["y"])],
        "add",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    record = quick_build(path, tmp_path / "out", target="onnxruntime").manifest.validation["inputs"]
    assert record["source"] == "generated" and record["count"] == 2 and len(record["sha256"]) == 64


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        ({"table": _T, "ids": np.zeros(3, np.int64)}, r"missing input\(s\) x"),
        ({**_sample(3), "extra": np.zeros(1)}, r"unknown input\(s\) extra"),
        (
            {"table": _T, "ids": np.zeros(3, np.float32), "x": _sample(3)["x"]},
            r"input ids is float32, the model takes int64",
        ),
        (
            {"table": _T, "ids": np.full(3, 2**40, np.int64).astype(np.float64), "x": _sample(3)["x"]},
            "the model takes int64",
        ),
        (
            {"table": _T, "ids": np.zeros(3, np.int64), "x": np.zeros((3, 5), np.float32)},
            "dim 1 is 5, the model fixes it at 4",
        ),
        (
            {"table": _T, "ids": np.zeros(3, np.int64), "x": np.zeros((4, 4), np.float32)},
            "dim seq is 3 in input ids but 4",
        ),
        ({"table": _T, "ids": np.zeros((3, 1), np.int64), "x": _sample(3)["x"]}, "the model takes rank 1"),
        (
            {"table": _T, "ids": np.zeros(40, np.int64), "x": np.zeros((40, 4), np.float32)},
            r"outside its declared range 1\.\.16",
        ),
    ],
)
def test_samples_that_do_not_fit_the_spec_get_one_clear_error(
    model: Path, tmp_path: Path, sample: dict[str, np.ndarray], message: str
) -> None:
    with pytest.raises(InputSpecError, match=message) as caught:
        quick_build(model, tmp_path / "out", target="onnxruntime", dynamic=["seq=1:16"], sample_inputs=[sample])
    assert "do not fit the model's inputs (table: float32 [2, 4], ids: int64 [seq], x: float32 [seq, 4])" in str(
        caught.value
    )


def test_lossless_casts_are_accepted(model: Path, tmp_path: Path) -> None:
    """int32 ids and float64 values (numpy's defaults) are cast to the inputs' dtypes."""
    sample = {"table": np.ones((ROWS, 4)), "ids": np.array([1, 0, 1], np.int32), "x": np.ones((3, 4))}
    result = quick_build(model, tmp_path / "out", target="onnxruntime", sample_inputs=[sample])
    assert result.manifest.validation["inputs"]["source"] == "sample_inputs"  # validated on them, not generated


def test_samples_the_source_model_rejects_say_which(model: Path, tmp_path: Path) -> None:
    bad = {**_sample(2), "ids": np.array([0, 7], np.int64)}
    with pytest.raises(InputSpecError, match=r"source model itself fails on sample 1 of --sample-inputs"):
        quick_build(model, tmp_path / "out", target="onnxruntime", sample_inputs=[_sample(2), bad])


def test_cli_and_recipe_take_sample_inputs(model: Path, tmp_path: Path) -> None:
    npz = tmp_path / "samples.npz"
    np.savez(npz, **_sample(4))
    runner = CliRunner()
    args = ["compile", str(model), "-t", "onnxruntime", "--no-bench", "-o", str(tmp_path / "out")]
    cli = runner.invoke(main, [*args, "--sample-inputs", str(npz)])
    assert cli.exit_code == 0, cli.output
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'target = "onnxruntime"\nsample_inputs = "{npz}"\n')
    by_recipe = runner.invoke(main, [*args, "--recipe", str(recipe)])
    assert by_recipe.exit_code == 0, by_recipe.output
    for output in (cli.output, by_recipe.output):
        manifest = json.loads((Path(output.strip().splitlines()[-1]) / "manifest.json").read_text())
        assert manifest["validation"]["inputs"]["path"] == str(npz)
    failed = runner.invoke(main, args)
    assert failed.exit_code != 0 and "--sample-inputs" in failed.output


def test_bfloat16_samples_from_npz(tmp_path: Path) -> None:
    """np.savez stores bfloat16 as raw V2 records: they are read back as the input's bfloat16."""
    path = tmp_path / "bf16.onnx"
    graph = helper.make_graph(
        [helper.make_node("Cast", ["a"], ["f"], to=TensorProto.FLOAT), helper.make_node("Sqrt", ["f"], ["y"])],
        "bf16",
        [helper.make_tensor_value_info("a", TensorProto.BFLOAT16, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    npz = tmp_path / "a.npz"
    np.savez(npz, a=np.array([4, -1, 0.25, np.inf], ml_dtypes.bfloat16))  # Sqrt(-1): NaN on both sides
    result = quick_build(path, tmp_path / "out", target="onnxruntime", sample_inputs=npz)
    assert result.manifest.validation["metrics"]["y"]["mismatched"] == 0


def _write(layout: str, samples: list[dict[str, np.ndarray]], root: Path) -> object:
    root.mkdir()
    if layout == "dicts":
        return samples
    if layout == "npz":
        np.savez(root / "one.npz", **samples[0])
        return root / "one.npz"
    if layout == "stacked_npz":
        np.savez(root / "all.npz", **{n: np.stack([s[n] for s in samples]) for n in samples[0]})
        return str(root / "all.npz")
    if layout == "npz_dir":
        for i, s in enumerate(samples):
            np.savez(root / f"sample_{i}.npz", **s)
        return root
    sets = [root] if layout == "pb_dir" else [root / f"test_data_set_{i}" for i in range(len(samples))]
    for directory, sample in zip(sets, samples, strict=False):
        directory.mkdir(exist_ok=True)
        for j, name in enumerate(("table", "ids", "x")):
            tensor = numpy_helper.from_array(sample[name], name)
            (directory / f"input_{j}.pb").write_bytes(tensor.SerializeToString())
    return root


def _digest(samples: list[dict[str, np.ndarray]]) -> str:
    from aotforge.compiler.sample_inputs import arrays_sha256

    return arrays_sha256(samples)


class _ScaledRoot(torch.nn.Module):
    """sqrt(x * scale) + bias: ``scale`` is a 0-d input, ``x`` bfloat16 (the output too)."""

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return (x.float() * scale).sqrt().to(torch.bfloat16)


def test_torch_model_with_0d_and_bfloat16_inputs(tmp_path: Path, cpu_target: str) -> None:
    """The eager reference and every CPU target take a 0-d input as 0-d, and bfloat16 both ways;
    a negative x gives NaN on both sides."""
    x = torch.tensor([[4.0, -1.0, 2.25], [0.0, 9.0, -4.0]], dtype=torch.bfloat16)
    example = {"x": x, "scale": torch.tensor(2.0)}
    given = [{"x": x.view(torch.int16).numpy().view(ml_dtypes.bfloat16), "scale": np.array(3.0, np.float32)}]
    result = quick_build(
        _ScaledRoot(), tmp_path / "out", example_inputs=example, target=cpu_target, sample_inputs=given
    )
    from aotforge import load

    out = load(result.path).run(given[0])
    (y,) = out.values()
    assert y.dtype == ml_dtypes.bfloat16 and y.shape == (2, 3)
    assert np.isnan(y.astype(np.float32)[0, 1]) and float(y[1, 1]) == pytest.approx(np.sqrt(27), rel=1e-2)
