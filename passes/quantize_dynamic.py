"""Dynamic INT8 quantization through ONNX Runtime: int8 weights, activations quantized at run time.

Suits MatMul-heavy models (transformers) where calibration data is not at hand. Graphs that
are already quantized (QAT QDQ pairs, an earlier INT8 pass) pass through untouched.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx_ir as ir
import onnx_ir.passes
from onnxruntime.quantization import QuantType, quantize_dynamic

from passes.base import GraphPass
from passes.ort_quantization import QUANTIZED_OPS, op_counts, quantize_through_files

#: What ORT's dynamic quantizer can turn into integer ops.
_QUANTIZABLE = frozenset({"MatMul", "Gemm", "Conv", "Attention", "LSTM", "Gather", "EmbedLayerNormalization"})


@dataclasses.dataclass(frozen=True)
class QuantizeDynamicParams:
    #: One scale per output channel of each weight: much closer to fp32 on transformers.
    per_channel: bool = True
    #: 7-bit weights, for CPUs without VNNI where u8s8 products can saturate.
    reduce_range: bool = False
    #: Op types to quantize; empty means ONNX Runtime's default set.
    op_types: tuple[str, ...] = ("MatMul", "Gemm")
    nodes_to_exclude: tuple[str, ...] = ()


class QuantizeDynamicPass(GraphPass):
    name = "int8-dynamic"
    Params = QuantizeDynamicParams
    changes_numerics = True

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        p = self.params
        already = op_counts(model)
        wanted = set(p.op_types) or _QUANTIZABLE
        candidates = [n for n in model.graph if n.op_type in wanted and n.name not in p.nodes_to_exclude]
        if already or not candidates:
            reason = "already quantized" if already else "no node to quantize"
            self.stats = {"nodes_quantized": 0, "skipped": reason}
            return onnx_ir.passes.PassResult(model, modified=False)

        def quantize(src: Path, dst: Path) -> None:
            quantize_dynamic(
                src,
                dst,
                op_types_to_quantize=list(p.op_types) or None,
                per_channel=p.per_channel,
                reduce_range=p.reduce_range,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=list(p.nodes_to_exclude),
            )

        quantize_through_files(model, quantize)
        ops = op_counts(model, QUANTIZED_OPS - {"DynamicQuantizeLinear"})
        self.stats = {"nodes_quantized": sum(ops.values()), "ops": ops, "candidates": len(candidates)}
        return onnx_ir.passes.PassResult(model, modified=True)
