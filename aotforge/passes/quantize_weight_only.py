"""Weight-only INT4 / INT8: MatMul weights stored blockwise in ``com.microsoft.MatMulNBits``.

Activations stay float, so nothing needs calibrating; what shrinks is the weight (4 or 8 bits
plus one scale per ``block_size`` values along K), which is what memory-bound decoders and large
embeddings want. ONNX Runtime's ``MatMulNBitsQuantizer`` does the work (round-to-nearest,
``DEFAULT`` algorithm). MatMulNBits is an ONNX Runtime contrib op: other targets refuse this
pass at planning time (``passes.CONTRIB_OP_PASSES``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx_ir as ir
import onnx_ir.passes

from aotforge.core.errors import OptionsError
from aotforge.passes.base import GraphPass
from aotforge.passes.ort_quantization import op_counts, quantize_through_files


@dataclasses.dataclass(frozen=True)
class QuantizeWeightOnlyParams:
    bits: int = 4
    #: Values along K sharing one scale: a power of two >= 16.
    block_size: int = 32
    symmetric: bool = True
    #: MatMulNBits' compute type: 0 (unset: fp32), 1 fp32, 2 fp16, 3 bf16, 4 int8 activations.
    accuracy_level: int = 0
    nodes_to_exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise OptionsError(f"pass weight-only: bits is 4 or 8, got {self.bits}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise OptionsError(f"pass weight-only: block_size is a power of two >= 16, got {self.block_size}")
        if not 0 <= self.accuracy_level <= 4:
            raise OptionsError(f"pass weight-only: accuracy_level is 0-4, got {self.accuracy_level}")


def _candidates(model: ir.Model, exclude: tuple[str, ...]) -> list[str]:
    """MatMuls whose weight is a constant 2-D matrix: the only ones MatMulNBits replaces."""
    names = []
    for node in model.graph:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or str(node.name) in exclude:
            continue
        weight = node.inputs[1]
        if weight is not None and weight.const_value is not None and len(weight.const_value.shape) == 2:
            names.append(str(node.name))
    return names


class QuantizeWeightOnlyPass(GraphPass):
    name = "weight-only"
    Params = QuantizeWeightOnlyParams
    changes_numerics = True

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        p = self.params
        unknown = sorted(set(p.nodes_to_exclude) - {str(n.name) for n in model.graph})
        if unknown:
            raise OptionsError(f"pass weight-only: nodes_to_exclude names no node of the graph: {', '.join(unknown)}")
        candidates = _candidates(model, p.nodes_to_exclude)
        if op_counts(model) or not candidates:
            reason = "already quantized" if op_counts(model) else "no MatMul with a constant 2-D weight"
            self.stats = {"nodes_quantized": 0, "skipped": reason}
            return onnx_ir.passes.PassResult(model, modified=False)
        float_bytes = sum(_weight_bytes(model, n) for n in candidates)

        def quantize(src: Path, dst: Path) -> None:
            import logging

            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

            # It logs one INFO line per node it skips (hundreds for a transformer).
            logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
            quantizer = MatMulNBitsQuantizer(
                str(src),
                bits=p.bits,
                block_size=p.block_size,
                is_symmetric=p.symmetric,
                accuracy_level=p.accuracy_level or None,
                nodes_to_exclude=list(p.nodes_to_exclude),
                op_types_to_quantize=("MatMul",),
            )
            quantizer.process()
            quantizer.model.save_model_to_file(str(dst))

        quantize_through_files(model, quantize)
        packed = [n for n in model.graph if n.op_type == "MatMulNBits"]
        packed_bytes = sum(_packed_bytes(n) for n in packed)
        self.stats = {
            "nodes_quantized": len(packed),
            "candidates": len(candidates),
            "bits": p.bits,
            "block_size": p.block_size,
            "weight_mb_before": round(float_bytes / 2**20, 3),
            "weight_mb_after": round(packed_bytes / 2**20, 3),
            "excluded": list(p.nodes_to_exclude),
        }
        return onnx_ir.passes.PassResult(model, modified=bool(packed))


def _weight_bytes(model: ir.Model, node_name: str) -> int:
    node = next(n for n in model.graph if str(n.name) == node_name)
    weight = node.inputs[1]
    assert weight is not None and weight.const_value is not None
    return int(weight.const_value.nbytes)


def _packed_bytes(node: ir.Node) -> int:
    """Packed weights, scales and zero points: every constant input after the activation."""
    return sum(int(v.const_value.nbytes) for v in node.inputs[1:] if v is not None and v.const_value is not None)
