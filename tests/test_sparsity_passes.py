"""2:4 structured and unstructured magnitude pruning: rewrites and skips (idempotence: test_passes_idempotent)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

from aotforge.passes import make_pass
from aotforge.passes.manager import run_passes
from aotforge.passes.prune_magnitude import PruneMagnitudePass
from aotforge.passes.prune_structured import PruneStructuredPass, prune_2_4
from tests.pass_models import cnn, elementwise, feeds_for, mlp, rel_l2, run


def _weight(model: ir.Model, name: str) -> np.ndarray:
    tensor = model.graph.initializers[name].const_value
    assert tensor is not None
    return tensor.numpy()


def test_sparsity24_rewrites_every_group_of_four_along_input_channels() -> None:
    model = cnn()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    original = _weight(model, "c2_w")
    records = run_passes(model, [make_pass("sparsity24", {"min_out_channels": "9"})])
    stats = records[0].stats
    assert stats["layers_pruned"] == 3 and stats["too_small"] == ["conv1", "conv2"]
    assert all(layer["sparsity"] == 0.5 for layer in stats["layers"])
    pruned = _weight(model, "c2_w")  # [M, C, kh, kw]: groups of four run along C
    groups = np.moveaxis(pruned, 1, -1).reshape(8, 3, 3, 2, 4)
    assert (np.count_nonzero(groups, axis=-1) == 2).all()
    kept = np.moveaxis(np.abs(original), 1, -1).reshape(8, 3, 3, 2, 4)
    assert (np.sort(kept, axis=-1)[..., 2:] == np.sort(np.abs(groups), axis=-1)[..., 2:]).all()
    # half of random weights go: the output moves, but stays the same model's output
    assert 0.05 < rel_l2(run(model, feeds)[0], expected) < 0.7


def test_sparsity24_follows_gemm_transb() -> None:
    array = np.arange(16, dtype=np.float32).reshape(2, 8)  # [N, K] as Gemm(transB=1) holds it
    assert prune_2_4(array, axis=1).tolist()[0] == [0, 0, 2, 3, 0, 0, 6, 7]


def test_prune_rewrites_to_target_ratio_within_tolerance() -> None:
    model = mlp()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    records = run_passes(model, [make_pass("prune", {"sparsity": "0.2"})])
    assert records[0].stats["layers_pruned"] == 2
    assert [layer["sparsity"] for layer in records[0].stats["layers"]] == pytest.approx([0.2, 0.2], abs=1e-3)
    assert np.count_nonzero(_weight(model, "w1") == 0) == int(0.2 * 32 * 64)
    # the smallest fifth of the weights carries little of the output
    assert rel_l2(run(model, feeds)[0], expected) < 0.25


def test_skips_layers_without_groups_of_four() -> None:
    model = mlp(hidden=30)  # w2 is [30, 16]: 30 input channels
    pass_ = PruneStructuredPass()
    assert pass_(model).modified
    assert pass_.stats["skipped"] == {"fc2": "input channels 30 not a multiple of 4"}
    assert np.count_nonzero(_weight(model, "w2") == 0) == 0


@pytest.mark.parametrize("cls", [PruneStructuredPass, PruneMagnitudePass])
def test_skips_model_without_weights(cls: type) -> None:
    pass_ = cls()
    assert not pass_(elementwise()).modified
    assert pass_.stats["layers_pruned"] == 0
