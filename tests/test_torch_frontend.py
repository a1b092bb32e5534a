"""nn.Module frontend: inputs bound by forward's parameter names, outputs named after the model's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import aotforge
from aotforge.core.errors import InputSpecError
from tests.conftest import quick_build


def _bert() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        attn_implementation="eager",
    )
    ids = torch.randint(0, 120, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 5:] = 0
    # Not forward's order (input_ids, attention_mask, token_type_ids): a positional binding swaps them.
    inputs = {"token_type_ids": torch.randint(0, 2, (2, 8)), "attention_mask": mask, "input_ids": ids}
    return BertModel(config).eval(), inputs


def _run(path: Path, inputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return aotforge.load(path).run({k: v.numpy() for k, v in inputs.items()})


def test_shuffled_dict_binds_by_name_and_outputs_keep_hf_names(cpu_target: str, tmp_path: Path) -> None:
    model, inputs = _bert()
    result = quick_build(model, tmp_path, target=cpu_target, example_inputs=inputs)
    assert [o["name"] for o in result.manifest.io["outputs"]] == ["last_hidden_state", "pooler_output"]
    assert [i["name"] for i in result.manifest.io["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    got = _run(result.path, inputs)
    with torch.no_grad():
        want = model(**inputs)
    np.testing.assert_allclose(got["last_hidden_state"], want.last_hidden_state.numpy(), atol=1e-4)
    np.testing.assert_allclose(got["pooler_output"], want.pooler_output.numpy(), atol=1e-4)


def test_batch_encoding_and_positional_inputs(tmp_path: Path) -> None:
    from transformers import BatchEncoding

    model, inputs = _bert()
    encoded = BatchEncoding({k: inputs[k] for k in ("attention_mask", "input_ids")})
    result = quick_build(model, tmp_path, target="onnxruntime", example_inputs=encoded, name="enc")
    with torch.no_grad():
        want = model(**encoded).last_hidden_state.numpy()
    np.testing.assert_allclose(_run(result.path, dict(encoded))["last_hidden_state"], want, atol=1e-4)

    positional = (inputs["input_ids"], inputs["attention_mask"])
    result = quick_build(model, tmp_path, target="onnxruntime", example_inputs=positional, name="pos")
    assert [i["name"] for i in result.manifest.io["inputs"]] == ["input_ids", "attention_mask"]
    np.testing.assert_allclose(_run(result.path, dict(encoded))["last_hidden_state"], want, atol=1e-4)


class Heads(nn.Module):
    """Outputs that trip a naive naming: an exporter-internal name, a repeated value, an input passed through."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor, scale: torch.Tensor, flag: bool = False) -> Any:
        embedding = self.embedding(ids) * (2.0 if flag else 1.0)
        logits = self.proj(embedding) * scale
        return {"embedding": embedding, "logits": logits, "again": logits, "tokens": ids}


class Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.relu(), x.sigmoid()


def test_outputs_named_after_dict_keys_and_tuple_positions(tmp_path: Path) -> None:
    ids, scale = torch.randint(0, 16, (3, 5)), torch.rand(1)
    model = Heads().eval()
    inputs = {"flag": True, "scale": scale, "ids": ids}
    result = quick_build(model, tmp_path, target="onnxruntime", example_inputs=inputs, name="heads")
    names = [o["name"] for o in result.manifest.io["outputs"]]
    assert names == ["embedding", "logits", "again", "tokens"]
    got = _run(result.path, {"ids": ids, "scale": scale})
    with torch.no_grad():
        want = model(ids, scale, flag=True)
    for name in names:
        np.testing.assert_allclose(got[name], want[name].numpy(), atol=1e-5)

    result = quick_build(Pair(), tmp_path, target="onnxruntime", example_inputs=[torch.randn(2, 3)], name="pair")
    assert [o["name"] for o in result.manifest.io["outputs"]] == ["output_0", "output_1"]


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"ids": torch.zeros(1, 4, dtype=torch.int64), "scal": torch.ones(1)}, "scal are not parameters of Heads"),
        ({"ids": torch.zeros(1, 4, dtype=torch.int64)}, "Heads.forward needs input.s. scale"),
        ((torch.zeros(1, 4, dtype=torch.int64), torch.ones(1), True, 1), "takes 3 positional inputs"),
    ],
)
def test_inputs_that_do_not_bind_are_refused_by_name(inputs: Any, message: str, tmp_path: Path) -> None:
    with pytest.raises(InputSpecError, match=message):
        quick_build(Heads(), tmp_path, target="onnxruntime", example_inputs=inputs)
