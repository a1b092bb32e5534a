"""int8-dynamic on a fused Attention block: QAttention with the mask rebuilt as mask_index, or float where the
bias cannot be proven a mask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir

from aotforge.passes.quantize_dynamic import QuantizeDynamicParams, QuantizeDynamicPass
from tests import quant_models
from tests.pass_models import INT8_REL_L2, rel_l2


def test_int8_dynamic_turns_fused_attention_into_qattention(tmp_path: Path) -> None:
    stacks = quant_models.attention_inputs(6, seed=3)
    calib = quant_models.save_stack(tmp_path / "calib", stacks)
    model = quant_models.attention_block()
    feeds = [{k: v[i] for k, v in stacks.items()} for i in range(6)]
    expected = [quant_models.run(model, f) for f in feeds]
    params = QuantizeDynamicParams(op_types=("Attention",), calibration_dir=calib, smooth_alpha=0.5)
    pass_ = QuantizeDynamicPass(params)
    assert pass_(model).modified
    assert pass_.stats["attention"] == {"weights_folded": 1, "qkv_sizes_dropped": 1, "mask_index": 1}
    assert pass_.stats["ops"] == {"QAttention": 1}
    for f, e in zip(feeds, expected, strict=True):  # padded keys stay masked: mask_index == the bias it replaced
        assert rel_l2(quant_models.run(model, f), e) < INT8_REL_L2


def test_qattention_mask_index_is_the_mask_not_token_ids_zero_at_the_same_places(tmp_path: Path) -> None:
    """A tokenizer's ids are 0 exactly where it pads: on calibration text they look like the mask too."""
    stacks = quant_models.attention_inputs(6, seed=3)
    ids = np.random.default_rng(4).integers(2, 1000, stacks["mask"].shape) * stacks["mask"]
    stacks = {"input_ids": ids, **stacks}
    calib = quant_models.save_stack(tmp_path / "calib", stacks)
    model = quant_models.attention_block()
    shape = ir.Shape([1, quant_models.SEQ])
    model.graph.inputs.insert(0, ir.Value(name="input_ids", type=ir.TensorType(ir.DataType.INT64), shape=shape))
    fp32 = quant_models.attention_block()
    pass_ = QuantizeDynamicPass(QuantizeDynamicParams(op_types=("Attention",), calibration_dir=calib))
    pass_(model)
    assert pass_.stats["attention"]["mask_index"] == 1
    cast = next(n for n in model.graph if n.op_type == "Cast" and str(n.name).endswith("_mask_index"))
    assert cast.inputs[0] is not None and cast.inputs[0].name == "mask"
    feed = {k: v[0] for k, v in stacks.items()}
    feed["mask"] = np.ones_like(feed["mask"])  # no padding: every key attended, whatever the ids say
    expected = quant_models.run(fp32, {"x": feed["x"], "mask": feed["mask"]})
    assert rel_l2(quant_models.run(model, feed), expected) < INT8_REL_L2


def test_int8_dynamic_keeps_attention_bias_it_cannot_prove_is_a_mask(tmp_path: Path) -> None:
    calib = quant_models.save_stack(tmp_path / "calib", quant_models.attention_inputs(4, seed=3))
    model = quant_models.attention_block()
    where = next(n for n in model.graph if n.name == "where")
    zero, lowest = where.inputs[1], where.inputs[2]
    where.replace_input_with(1, lowest)  # an inverted mask: not what mask_index would rebuild
    where.replace_input_with(2, zero)
    pass_ = QuantizeDynamicPass(QuantizeDynamicParams(op_types=("Attention",), calibration_dir=calib))
    pass_(model)
    assert pass_.stats["attention"]["mask_index"] == 0 and pass_.stats["ops"] == {}  # stays float Attention
    assert pass_.stats["float_attention_bias"] == ["attention"]  # ORT's quantizer would have dropped the bias
