"""transformers model directories: ``aotforge compile DIR --task T`` on the supported-architectures table.

Every encoder and vision row of README.md's "Supported models" table is a row here: a config with random
weights, saved with ``save_pretrained`` (and a tokenizer stand-in), compiled through the CLI for
each CPU target, then run on inputs made by the artifact's own copy of the tokenizer or image
processor and compared with the transformers model on the same inputs.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import aotforge
from aotforge.artifacts.manifest import read_manifest
from aotforge.compiler.cli import main
from aotforge.core.errors import ModelLoadError, OptionsError
from aotforge.core.spec import DimRange
from tests.conftest import EXAMPLES, quick_build
from tests.hf_models import ARCHITECTURES, save_model

#: Rows in the default run (one text, one image model); the rest are slow.
DEFAULT_ROWS = ("bert", "resnet")
ROWS = [pytest.param(n, marks=() if n in DEFAULT_ROWS else pytest.mark.slow) for n in ARCHITECTURES]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    root = tmp_path_factory.mktemp("hf")
    return lambda name: root / name if (root / name).is_dir() else save_model(name, root)


@pytest.mark.parametrize("arch", ROWS)
def test_supported_architecture(arch: str, cpu_target: str, saved: Callable[[str], Path], tmp_path: Path) -> None:
    spec, path = ARCHITECTURES[arch], saved(arch)
    # In-process: the command line as a user types it, without re-importing torch for every row.
    args = ["compile", str(path), "--task", spec.task, "--target", cpu_target, "--out", str(tmp_path), "--no-bench"]
    proc = CliRunner().invoke(main, args)
    assert proc.exit_code == 0, proc.output
    artifact = Path(proc.stdout.strip().splitlines()[-1])
    manifest = read_manifest(artifact)
    assert manifest.source["frontend"] == "transformers" and manifest.source["task"] == spec.task
    dims = {d["name"]: d for d in manifest.io["dims"]}
    assert set(dims) == ({"batch", "seq"} if spec.text else {"batch"})
    # Tokenizer / preprocessor files ride along, hashed like every file of the artifact.
    assert set(manifest.source["preprocessing"]) <= set(manifest.files)
    assert "preprocessing/config.json" in manifest.files
    inputs = _real_inputs(artifact, manifest.io, spec.text)
    got = aotforge.load(artifact).run(inputs)
    want = _transformers_outputs(path, spec.model_class, inputs)
    assert list(got) == [o["name"] for o in manifest.io["outputs"]]
    for name, value in got.items():
        np.testing.assert_allclose(value, want[name], rtol=1e-3, atol=1e-4, err_msg=name)


def _real_inputs(artifact: Path, io: dict[str, Any], text: bool) -> dict[str, np.ndarray]:
    """Inputs as a serving host makes them, from the artifact's own preprocessing files, at the opt shape."""
    from transformers import AutoImageProcessor, AutoTokenizer

    dims = {d["name"]: d["opt"] for d in io["dims"]}
    names = [i["name"] for i in io["inputs"]]
    if text:
        tokenizer = AutoTokenizer.from_pretrained(artifact / "preprocessing", local_files_only=True)
        sentences = [" ".join(textwrap.__doc__.split()[:40])] * dims["batch"]  # type: ignore[union-attr]
        encoded = tokenizer(sentences, padding="max_length", truncation=True, max_length=dims["seq"])
        return {n: np.asarray(encoded[n], dtype=np.int64) for n in names}
    (name,) = names  # pixel_values, or a speech encoder's input_features
    shape = io["inputs"][0]["shape"]
    rng = np.random.default_rng(0)
    if not (artifact / "preprocessing" / "preprocessor_config.json").is_file():  # sized from the config
        return {name: rng.standard_normal((dims["batch"], *shape[1:])).astype(np.float32)}
    processor = AutoImageProcessor.from_pretrained(artifact / "preprocessing", local_files_only=True)
    images = [(rng.random((shape[2] + 7, shape[3] + 5, 3)) * 255).astype(np.uint8) for _ in range(dims["batch"])]
    pixels = processor(images=images, return_tensors="np")["pixel_values"].astype(np.float32)
    assert pixels.shape[1:] == tuple(shape[1:])
    return {"pixel_values": pixels}


def _transformers_outputs(path: Path, model_class: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import transformers

    model = getattr(transformers, model_class).from_pretrained(path, local_files_only=True).eval()
    if model.config.is_encoder_decoder:
        model = model.get_encoder()
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    # A decoder's cache is not a tensor and not an output of the artifact (no cache).
    return {k: v.numpy() for k, v in out.items() if isinstance(v, torch.Tensor)}


def test_task_from_config_and_dynamic_override(saved: Callable[[str], Path], tmp_path: Path) -> None:
    """No task: the config's architectures say fill-mask; --dynamic replaces the default seq range only."""
    result = quick_build(str(saved("bert-mlm")), tmp_path, target="onnxruntime", dynamic=(DimRange("seq", 1, 16, 32),))
    assert result.manifest.source["task"] == "fill-mask"
    assert [o["name"] for o in result.manifest.io["outputs"]] == ["logits"]
    assert {d["name"]: (d["min"], d["opt"], d["max"]) for d in result.manifest.io["dims"]} == {
        "batch": (1, 1, 32),
        "seq": (1, 16, 32),
    }
    # ONNX Runtime keeps the dims symbolic: another batch and length in the range run too.
    out = aotforge.load(result.path).run(
        {
            "input_ids": np.ones((3, 20), np.int64),
            "attention_mask": np.ones((3, 20), np.int64),
            "token_type_ids": np.zeros((3, 20), np.int64),
        }
    )
    assert out["logits"].shape == (3, 20, 128)


@pytest.mark.parametrize(
    ("model", "overrides", "error", "message"),
    [
        ("empty", {}, ModelLoadError, "directory without config.json"),
        ("bert", {"task": "summarization"}, OptionsError, "unknown task 'summarization'"),
        (str(EXAMPLES / "mini_resnet.py"), {"task": "image-classification"}, OptionsError, "transformers model dir"),
    ],
)
def test_refusals(
    model: str, overrides: dict[str, Any], error: type, message: str, saved: Callable[[str], Path], tmp_path: Path
) -> None:
    if model == "empty":
        model = str(tmp_path)
    elif model == "bert":
        model = str(saved("bert"))
    with pytest.raises(error, match=message):
        quick_build(model, tmp_path / "out", target="onnxruntime", **overrides)


def test_a_bundle_carries_the_tokenizer_and_the_source_details(saved: Callable[[str], Path], tmp_path: Path) -> None:
    """--prepare-only + finish (and so every multi-target and farm build) ships what a direct build ships."""
    from aotforge.compiler.bundle import finish

    prepared = aotforge.build(
        saved("bert"), task="feature-extraction", target="onnxruntime", prepare_only=True, out=tmp_path
    )
    artifact = finish(prepared.path, tmp_path / "art", bench=False).path
    manifest = read_manifest(artifact)
    assert manifest.source["frontend"] == "transformers" and manifest.source["task"] == "feature-extraction"
    assert "preprocessing/config.json" in manifest.files
    assert set(manifest.source["preprocessing"]) <= set(manifest.files)
    assert all((artifact / rel).is_file() for rel in manifest.source["preprocessing"])
