"""What the two INT8 passes share: spotting quantized graphs and a file round-trip through ORT's quantizer.

``onnxruntime.quantization`` reads and writes model files, so the IR is saved to a temporary
directory, quantized there, loaded back with its weights in memory, and moved into the model
the pass was given (passes are in place).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx_ir as ir
import onnx_ir.external_data

from aotforge.passes.integer_range import IntegerWeights

#: Ops that mean a graph is already quantized (QAT's QDQ pairs or an earlier INT8 pass).
QUANTIZED_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger"}
    | {"QLinearConv", "QLinearMatMul", "DynamicQuantizeMatMul", "QAttention", "QGemm", "MatMulNBits"}
)


def op_counts(model: ir.Model, ops: frozenset[str] = QUANTIZED_OPS) -> dict[str, int]:
    """How many nodes of each op in ``ops`` the main graph holds."""
    counts: dict[str, int] = {}
    for node in model.graph.all_nodes():
        if node.op_type in ops:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def quantize_through_files(
    model: ir.Model, quantize: Callable[[Path, Path], None], source: ir.Model | None = None
) -> None:
    """Run ``quantize(src, dst)`` on a saved copy of ``source`` (default ``model``); put ``dst`` into ``model``."""
    with tempfile.TemporaryDirectory(prefix="aotforge-quant-") as tmp:
        src, dst = Path(tmp) / "model.onnx", Path(tmp) / "quantized.onnx"
        ir.save(source if source is not None else model, src)
        quantize(src, dst)
        quantized = onnx_ir.external_data.load_to_model(ir.load(dst))
    adopt(model, quantized)


def adopt(model: ir.Model, quantized: ir.Model) -> None:
    """Move ``quantized``'s graph into ``model`` (passes work in place)."""
    model.graph = quantized.graph
    model.ir_version = quantized.ir_version
    model.functions.clear()
    model.functions.update(quantized.functions)


def ort_weight_options(weights: IntegerWeights) -> dict[str, Any]:
    """ONNX Runtime's quantizer arguments for ``weights`` (resolved, ``integer_range``)."""
    from onnxruntime.quantization import QuantType

    weight_type = QuantType.QUInt8 if weights is IntegerWeights.UINT8 else QuantType.QInt8
    return {"reduce_range": weights is IntegerWeights.INT8_7BIT, "weight_type": weight_type}


def quantize_dynamic_int8(
    model: ir.Model, per_channel: bool, op_types: tuple[str, ...], exclude: list[str], weights: IntegerWeights
) -> None:
    """ONNX Runtime's dynamic quantization of ``model`` in place: ``weights`` (resolved, ``integer_range``), uint8
    activations at run time."""
    from onnxruntime.quantization import quantize_dynamic

    def quantize(src: Path, dst: Path) -> None:
        quantize_dynamic(
            src,
            dst,
            op_types_to_quantize=list(op_types) or None,
            per_channel=per_channel,
            **ort_weight_options(weights),
            nodes_to_exclude=exclude,
        )

    quantize_through_files(model, quantize)


def split_held_out(loaded: list, samples: int, held_out: int) -> tuple[list, list]:
    """Calibration and held-out parts of ``loaded``: ``samples`` then up to ``held_out`` more; a quarter if few."""
    if len(loaded) > samples:
        return loaded[:samples], loaded[samples : samples + held_out]
    keep = len(loaded) - max(1, len(loaded) // 4) if len(loaded) > 1 else len(loaded)
    return loaded[:keep], loaded[keep:]
