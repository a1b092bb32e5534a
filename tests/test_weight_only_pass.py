"""Weight-only INT4 / INT8 (MatMulNBits): rewrites within tolerance, skips, idempotent, refused off ORT."""

from __future__ import annotations

from pathlib import Path

import pytest

from aotforge.core.errors import OptionsError, PassFailedError, UnsupportedModelError
from aotforge.passes import make_pass
from aotforge.passes.manager import run_passes
from aotforge.passes.ort_quantization import op_counts
from tests.pass_models import elementwise, feeds_for, mlp, rel_l2, run


@pytest.mark.parametrize(("bits", "tolerance"), [(4, 0.15), (8, 0.01)])
def test_weight_only_packs_matmul_weights_within_tolerance(bits: int, tolerance: float) -> None:
    model = mlp()
    feeds = feeds_for(model)
    expected = run(model, feeds)[0]
    (record,) = run_passes(model, [make_pass("weight-only", {"bits": str(bits)})])
    stats = record.stats
    # fc1 is a MatMul, fc2 a Gemm with a bias: both taken, fc2 as MatMulNBits + Add.
    assert stats["nodes_quantized"] == 2 and op_counts(model) == {"MatMulNBits": 2}
    assert stats["taken"] == ["fc1", "fc2"] and stats["not_taken"] == {}
    assert stats["weight_mb_after"] < stats["weight_mb_before"]
    assert rel_l2(run(model, feeds)[0], expected) < tolerance


def test_weight_only_skips_a_graph_without_constant_matmul_weights() -> None:
    model = elementwise()
    (record,) = run_passes(model, [make_pass("weight-only")])
    assert record.stats["skipped"] == "no MatMul or Gemm with a constant 2-D weight"


def test_weight_only_is_idempotent_and_exclusions_must_name_nodes() -> None:
    model = mlp()
    run_passes(model, [make_pass("weight-only")])
    (again,) = run_passes(model, [make_pass("weight-only")])
    assert again.stats["skipped"] == "already quantized"
    with pytest.raises(PassFailedError, match="names no node"):
        run_passes(mlp(), [make_pass("weight-only", {"nodes_to_exclude": "fc9"})])
    model = mlp()
    (kept,) = run_passes(model, [make_pass("weight-only", {"nodes_to_exclude": "fc1"})])
    assert kept.stats["taken"] == ["fc2"] and kept.stats["not_taken"] == {"fc1": "excluded (nodes_to_exclude)"}
    assert [n.op_type for n in model.graph if n.name == "fc1"] == ["MatMul"]
    (both,) = run_passes(mlp(), [make_pass("weight-only", {"nodes_to_exclude": "fc1,fc2"})])
    assert both.stats["skipped"] == "no MatMul or Gemm with a constant 2-D weight"


def test_weight_only_parameters_are_validated() -> None:
    for bad in ({"bits": "3"}, {"block_size": "24"}, {"accuracy_level": "7"}):
        with pytest.raises(OptionsError, match="pass weight-only"):
            make_pass("weight-only", bad)


def test_tvm_refuses_weight_only_at_planning_by_name(tmp_path: Path) -> None:
    from aotforge.compiler.api import build

    with pytest.raises(UnsupportedModelError, match="weight-only"):
        build("examples/mini_resnet.py", target="tvm", passes=("O1", "weight-only"), out=tmp_path, bench=False)
    assert not any(tmp_path.iterdir())
