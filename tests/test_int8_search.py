"""int8 / int8-dynamic under --accuracy-budget on models users bring: the method search holds the budget.

Models are built here, none from ``examples/``: a transformers BERT (tiny with random weights by
default; the real all-MiniLM-L6-v2 behind ``slow``) wrapped as a sentence embedder and exported with
``torch.onnx.export(dynamo=True)`` and dynamic batch / seq axes, and a MobileNet-style CNN (depthwise
convs, BatchNorm, ReLU6). Calibration is real English (stdlib docstrings) or seeded images; every
figure is measured on other inputs than the search saw, through the built artifact.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aotforge
from aotforge.compiler.numerics import OutputMetrics
from aotforge.compiler.validation import failure_message, validate
from aotforge.core.errors import PassFailedError
from aotforge.targets.onnxruntime import reference_session
from tests import hf_models, user_cnn, user_minilm
from tests.conftest import quick_build

logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization logs a warning per call


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _stats(result: Any, name: str) -> dict[str, Any]:
    return next(p["stats"] for p in result.manifest.passes if p["name"] == name)


def _held_out_cosines(artifact: Path, source: Path, feeds: list[dict[str, np.ndarray]]) -> np.ndarray:
    """Per feed, the cosine between the artifact's embedding and the source ONNX's (ORT fp32)."""
    runner, reference = aotforge.load(artifact), reference_session(str(source))
    got = np.concatenate([runner.run(f)["sentence_embedding"] for f in feeds])
    ref = np.concatenate([reference.run(None, f)[0] for f in feeds])
    return _cosines(got, ref)


@pytest.fixture(scope="module")
def sentences(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """A calibration directory of 128 docstring sentences (one .npz each) and 64 other ones' feeds."""
    calibration, held_out = user_minilm.calibration_and_held_out(128, 64)
    return user_minilm.save_feeds(tmp_path_factory.mktemp("calibration"), calibration), held_out


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return user_minilm.export_sentence_embedder(user_minilm.tiny_bert(), tmp_path_factory.mktemp("tiny") / "m.onnx")


@pytest.mark.parametrize("int8_pass", ["int8", "int8-dynamic"])
def test_search_holds_the_budget_on_a_small_transformer_export(
    int8_pass: str, tiny_export: Path, sentences: tuple[Path, list], tmp_path: Path
) -> None:
    calibration, held_out = sentences
    result = quick_build(
        str(tiny_export),
        tmp_path,
        target="onnxruntime",
        passes=["O1", int8_pass],
        calibration=str(calibration),
        accuracy_budget=0.999,
        tolerance=0.1,
    )
    stats = _stats(result, int8_pass)
    record = stats["accuracy_budget"]
    assert stats["method"] == record["chosen"] and record["held_out"]["mean"] >= 0.999
    assert record["tried"][-1]["mean"] == record["held_out"]["mean"] and record["held_out"]["samples"] >= 32
    assert stats["nodes_quantized"] > 0
    if int8_pass == "int8":  # static QDQ misses on this model's outlier channels: the search moves to dynamic
        assert record["tried"][0]["mean"] < 0.999 and stats["method"]["kind"] == "dynamic"
    cos = _held_out_cosines(result.path, tiny_export, held_out[:16])
    assert cos.mean() >= 0.998, cos


def test_impossible_budget_fails_with_the_ranking_and_the_best_cosine(
    tiny_export: Path, sentences: tuple[Path, list], tmp_path: Path
) -> None:
    with pytest.raises(PassFailedError, match="no method holds the accuracy budget") as info:
        quick_build(
            str(tiny_export),
            tmp_path,
            target="onnxruntime",
            passes=["O1", "int8-dynamic"],
            calibration=str(sentences[0]),
            accuracy_budget=1.0,
            pass_params={"int8-dynamic": {"max_exclusions": 2, "search_alphas": [0.5]}},
        )
    message = str(info.value)
    # The best cosine, whatever it is (uint8 weights on a CPU without VNNI come within rounding of 1.0).
    assert re.search(r"best reached: mean (0\.\d+|1\.0), min (0\.\d+|1\.0) \(", message), message
    assert "nodes of the best method by added error: node_" in message
    assert "dynamic, per-channel, smooth 0.5 (ratio 5)" in message and "2 float" in message


@pytest.mark.parametrize(
    ("cosine", "says", "never"),
    [(0.14, "breaks the model", "raise --tolerance"), (0.97, "raise --tolerance", "breaks the model")],
)
def test_validation_failure_below_cosine_0_9_says_the_pass_breaks_the_model(
    cosine: float, says: str, never: str
) -> None:
    message = failure_message("m", "onnxruntime", {"y": OutputMetrics(0.5, 0.6, cosine)}, 0.1)
    assert says in message and never not in message


@pytest.mark.slow
@pytest.mark.parametrize("int8_pass", ["int8", "int8-dynamic"])
def test_search_holds_the_budget_on_a_user_minilm_export(
    int8_pass: str, sentences: tuple[Path, list], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The issue's figure: real all-MiniLM-L6-v2, 128 real calibration sentences, 64 other ones held out."""
    source = user_minilm.export_minilm(tmp_path_factory.mktemp("minilm") / "model.onnx")
    calibration, held_out = sentences
    result = quick_build(
        str(source),
        tmp_path_factory.mktemp("out"),
        target="onnxruntime",
        passes=["O1", int8_pass],
        calibration=str(calibration),
        accuracy_budget=0.995,
        pass_params={int8_pass: {"min_sample_cosine": 0.99}},
        tolerance=0.2,
    )
    stats = _stats(result, int8_pass)
    assert stats["method"]["kind"] == "dynamic"  # static QDQ misses the budget (asserted next), the search moves on
    assert stats["accuracy_budget"]["tried"][0]["mean"] < 0.995 <= stats["accuracy_budget"]["held_out"]["mean"]
    cos = _held_out_cosines(result.path, source, held_out)
    assert cos.mean() >= 0.995 and cos.min() >= 0.99, (cos.mean(), cos.min())


@pytest.mark.slow
def test_fused_int8_dynamic_on_a_user_minilm_export_holds_the_bar_and_validates_on_random_and_real_inputs(
    sentences: tuple[Path, list], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """ONNX Runtime's fast path (fuse-ort: QAttention, SkipLayerNormalization split) holds the issue's bar.

    The smoothing the search picks (0.8) once scaled up the channels quiet on the calibration
    sentences: 0.998 on held-out sentences, but cosine 0.86 on the build's random token ids (up to
    seq 512), so validation failed; smoothing only the outlier channels passes both.
    """
    source = user_minilm.export_minilm(tmp_path_factory.mktemp("minilm_fused") / "model.onnx")
    calibration, held_out = sentences
    result = quick_build(
        str(source),
        tmp_path_factory.mktemp("out"),
        target="onnxruntime",
        passes=["optimize", "fuse-ort", "int8-dynamic"],
        calibration=str(calibration),
        accuracy_budget=0.995,
        pass_params={"int8-dynamic": {"min_sample_cosine": 0.99}},
        validation_samples=4,
        tolerance=0.2,  # rel L2 of the unit-norm embedding on random ids at seq 1, 128 and 512
    )
    stats = _stats(result, "int8-dynamic")
    assert stats["ops"]["QAttention"] == 6 and stats["skip_layer_norm_split"] == 12
    validation = result.manifest.validation
    assert validation["inputs"]["source"] == "generated"
    cos = _held_out_cosines(result.path, source, held_out)
    assert cos.mean() >= 0.995 and cos.min() >= 0.99, (cos.mean(), cos.min())
    # The same check on real sentences, as --sample-inputs gives them: well inside a tenth.
    runner, reference = aotforge.load(result.path), reference_session(str(source))
    names = [o.name for o in reference.get_outputs()]
    record = validate(
        lambda f: dict(zip(names, reference.run(None, f), strict=True)),
        runner.run,
        held_out[:16],
        {"tolerance": 0.1},
        model="minilm",
        target="onnxruntime",
    )
    assert record["passed"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["bert", "roberta", "distilbert"])
def test_fused_int8_dynamic_validates_on_transformers_encoders_from_config(arch: str, tmp_path: Path) -> None:
    """The same fast path on transformers' own BERT, RoBERTa and DistilBERT (random weights, not MiniLM):
    QAttention on every layer (the mask proved on calibration feeds with padding) and it validates.
    MiniLM-sized (hidden 384, 6 layers) they ran at 0.31-0.35x their fp32 artifacts."""
    spec = hf_models.ARCHITECTURES[arch]
    rng = np.random.default_rng(0)
    calibration = tmp_path / "calibration"
    calibration.mkdir()
    for i in range(8):
        ids, mask = rng.integers(5, hf_models.VOCAB, (1, 32)), np.ones((1, 32), np.int64)
        mask[:, int(rng.integers(8, 32)) :] = 0
        ids[mask == 0] = 0
        feed = {"input_ids": ids, "attention_mask": mask}
        feed |= {} if arch == "distilbert" else {"token_type_ids": np.zeros_like(ids)}
        np.savez(calibration / f"{i}.npz", **feed)
    result = quick_build(
        str(hf_models.save_model(arch, tmp_path)),
        tmp_path / "out",
        task=spec.task,
        target="onnxruntime",
        passes=["optimize", "fuse-ort", "int8-dynamic"],
        calibration=str(calibration),
        tolerance=0.2,
    )
    stats = _stats(result, "int8-dynamic")
    assert stats["ops"]["QAttention"] == 2 and stats["attention"]["mask_index"] == 2, stats


@pytest.mark.slow
@pytest.mark.parametrize("target", ["onnxruntime", "tvm"])
def test_search_holds_the_budget_on_a_mobilenet_style_cnn(target: str, tmp_path: Path) -> None:
    """Static QDQ with per-channel weights holds; top-1 agreement with the module on 256 other images."""
    import torch

    size = 96
    model = user_cnn.mobilenet(size=size)
    np.save(tmp_path / "images.npy", user_cnn.images(64, seed=1, size=size))
    result = quick_build(
        model,
        tmp_path / "out",
        example_inputs={"image": torch.from_numpy(user_cnn.images(1, seed=5, size=size)[0])},
        target=target,
        passes=["O1", "int8"],
        calibration=str(tmp_path),
        accuracy_budget=0.999,
        tolerance=0.2,
    )
    stats = _stats(result, "int8")
    assert stats["method"]["kind"] == "static" and stats["ops"]["Conv"] == 20
    test = user_cnn.images(256, seed=2, size=size)
    runner = aotforge.load(result.path)
    got = np.concatenate([next(iter(runner.run({"image": x}).values())) for x in test])
    with torch.no_grad():
        ref = model(torch.from_numpy(test[:, 0])).numpy()
    assert np.mean(got.argmax(1) == ref.argmax(1)) >= 0.99
