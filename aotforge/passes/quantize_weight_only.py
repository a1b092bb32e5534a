"""Weight-only INT4 / INT8: MatMul and Gemm weights stored blockwise in ``com.microsoft.MatMulNBits``.

Activations stay float, so nothing needs calibrating; what shrinks is the weight (4 or 8 bits
plus one scale per ``block_size`` values along K), which is what memory-bound decoders and large
embeddings want. ONNX Runtime's ``MatMulNBitsQuantizer`` does the work: round-to-nearest (its
``DEFAULT`` algorithm) for ``method`` ``rtn`` and for the methods a text-generation build calibrates
on the torch model before the export (``awq``, ``gptq``: ``compiler/generative/calibrate.py``, whose
weights this rounding keeps), ``HQQWeightOnlyQuantConfig`` for ``hqq`` (asymmetric blocks with float
zero points, no calibration). ``layers_8bit``: the decoder layers whose matmuls stay at 8 bits (a
decoder's weight matmuls come layer by layer in graph order, the head last). MatMulNBits is an ONNX
Runtime contrib op: other targets refuse this pass at planning time (``passes.CONTRIB_OP_PASSES``).
The stats name each MatMul / Gemm taken, its bits, and why each other one was not (``survey``): a
decoder's LM head is a Gemm, tied to the embedding or not, or over a 3-D activation (a verify graph's logits at
every position) a MatMul against a Transpose of the tied embedding, taken as the Gemm is.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import onnx_ir as ir
import onnx_ir.passes

from aotforge.core.decoder_layers import layer_indices
from aotforge.core.errors import OptionsError
from aotforge.passes.base import GraphPass, GraphRole
from aotforge.passes.integer_gemm import integer_gemms
from aotforge.passes.integer_range import saturating_cpu
from aotforge.passes.ort_quantization import op_counts, quantize_through_files
from aotforge.passes.weight_matmuls import (
    gemms_as_matmuls,
    head_nodes,
    survey,
    transposed_weights_as_constants,
    weight_bytes,
    weight_shape_by_name,
)

#: rtn: round to nearest; hqq: ONNX Runtime's half-quadratic fit (asymmetric); awq / gptq / awq+gptq: weights
#: calibrated on text before the export (text-generation builds), then rounded to nearest.
METHODS = ("rtn", "hqq", "awq", "gptq", "awq+gptq")
#: Methods that change the source model's weights before the export.
CALIBRATED = ("awq", "gptq", "awq+gptq")
#: A text-generation build's int4 method when none is given: the one of least held-out perplexity measured on a
#: real model at the same decode speed (docs/benchmarks.md#low-bit-quality); ``method=rtn`` skips calibration.
DECODER_INT4_METHOD = "awq"


@dataclasses.dataclass(frozen=True)
class QuantizeWeightOnlyParams:
    bits: int = 4
    #: Values along K sharing one scale: a power of two >= 16.
    block_size: int = 32
    symmetric: bool = True
    #: MatMulNBits' compute type: 0 (unset: fp32), 1 fp32, 2 fp16, 3 bf16, 4 int8 activations.
    accuracy_level: int = 0
    nodes_to_exclude: tuple[str, ...] = ()
    #: The LM head's bits (a MatMul / Gemm whose output is a graph output, tied or not) when it differs from
    #: ``bits``: a decoder's most sensitive matmul (llama.cpp keeps it at 6 bits); 0: ``bits``.
    head_bits: int = 0
    #: How the 4-bit weights are chosen (:data:`METHODS`); calibrated ones only in text-generation builds.
    method: str = "rtn"
    #: Decoder layers (0-based) whose matmuls are quantized to 8 bits instead of ``bits``.
    layers_8bit: tuple[int, ...] = ()
    #: Text-generation builds: how many of the layers most sensitive to 4 bits (measured on calibration text) to
    #: keep at 8 bits, added to ``layers_8bit``.
    sensitive_layers_8bit: int = 0
    #: The decoder's layer count, which ``layers_8bit`` needs (text-generation builds set it).
    layers: int = 0
    #: The matmuls other than the head as 8-bit integer GEMM (``passes/integer_gemm``: int8 weights per column,
    #: int8 activations per row) instead of MatMulNBits, in every graph but a decoder's decode graph
    #: (``for_graph``): a prompt's many rows run several times faster through ONNX Runtime's QGEMM, a decode
    #: step's few rows stream 4-bit weights.
    prompt_int8: bool = False

    def __post_init__(self) -> None:
        try:  # from the CLI a tuple's items arrive as strings ("3,7")
            object.__setattr__(self, "layers_8bit", tuple(sorted({int(i) for i in self.layers_8bit})))
        except ValueError:
            raise OptionsError(f"pass weight-only: layers_8bit are layer indices, got {self.layers_8bit}") from None
        if self.method not in METHODS:
            raise OptionsError(f"pass weight-only: method is one of {', '.join(METHODS)}, got {self.method!r}")
        if self.sensitive_layers_8bit < 0 or any(i < 0 for i in self.layers_8bit):
            raise OptionsError("pass weight-only: layers_8bit are layer indices >= 0, sensitive_layers_8bit >= 0")
        if self.bits not in (4, 8):
            raise OptionsError(f"pass weight-only: bits is 4 or 8, got {self.bits}")
        if self.head_bits not in (0, 4, 8):
            raise OptionsError(f"pass weight-only: head_bits is 4 or 8 (0: bits), got {self.head_bits}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise OptionsError(f"pass weight-only: block_size is a power of two >= 16, got {self.block_size}")
        if not 0 <= self.accuracy_level <= 4:
            raise OptionsError(f"pass weight-only: accuracy_level is 0-4, got {self.accuracy_level}")


class QuantizeWeightOnlyPass(GraphPass):
    name = "weight-only"
    Params = QuantizeWeightOnlyParams
    changes_numerics = True

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        p = self.params
        unknown = sorted(set(p.nodes_to_exclude) - {str(n.name) for n in model.graph})
        if unknown:
            raise OptionsError(f"pass weight-only: nodes_to_exclude names no node of the graph: {', '.join(unknown)}")
        transposed_weights_as_constants(model)
        candidates, not_taken = survey(model, p.nodes_to_exclude)
        if op_counts(model) or not candidates:
            reason = "already quantized" if op_counts(model) else "no MatMul or Gemm with a constant 2-D weight"
            self.stats = {"nodes_quantized": 0, "skipped": reason}
            return onnx_ir.passes.PassResult(model, modified=False)
        float_bytes = sum(weight_bytes(model, n) for n in candidates)
        gemms_as_matmuls(model, candidates)
        bits_of = self._bits_by_node(model, candidates)
        saturates = saturating_cpu()  # then uint8 weights (``integer_gemm``)
        body = [n for n in candidates if n not in self._head_names]
        integer = integer_gemms(model, body, bool(saturates)) if p.prompt_int8 else []
        bits_of = {n: b for n, b in bits_of.items() if n not in integer}

        def quantize(src: Path, dst: Path) -> None:
            import logging

            from onnxruntime.quantization.matmul_nbits_quantizer import (
                HQQWeightOnlyQuantConfig,
                MatMulNBitsQuantizer,
            )

            # It logs one INFO line per node it skips (hundreds for a transformer).
            logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)

            def run(model: Any, bits: int, names: list[str]) -> Any:
                hqq = p.method == "hqq" and bits == p.bits
                quantizer = MatMulNBitsQuantizer(
                    model,
                    bits=bits,
                    block_size=p.block_size,
                    is_symmetric=p.symmetric,
                    accuracy_level=p.accuracy_level or None,
                    # ORT quantizes every MatMul not excluded: each run excludes the nodes of the other precisions.
                    nodes_to_exclude=[*p.nodes_to_exclude, *(n for n in candidates if n not in names)],
                    op_types_to_quantize=("MatMul",),
                    algo_config=(
                        HQQWeightOnlyQuantConfig(block_size=p.block_size, bits=bits, op_types_to_quantize=("MatMul",))
                        if hqq
                        else None
                    ),
                )
                quantizer.process()
                return quantizer.model

            done: Any = str(src)
            for bits in sorted(set(bits_of.values())):
                names = [n for n, b in bits_of.items() if b == bits]
                done = run(done if isinstance(done, str) else done.model, bits, names)
            _set_accuracy_level(done.model, p.accuracy_level)
            done.save_model_to_file(str(dst))

        if bits_of:
            quantize_through_files(model, quantize)
        packed = [n for n in model.graph if n.op_type in ("MatMulNBits", "MatMulInteger")]
        packed_bytes = sum(_packed_bytes(n) for n in packed)
        taken = sorted(set(candidates) & {_source_name(n) for n in packed})
        not_taken |= {n: "left float by the quantizer" for n in candidates if n not in taken}
        self.stats = {
            "nodes_quantized": len(packed),
            "candidates": len(candidates),
            "bits": p.bits,
            "block_size": p.block_size,
            "weight_mb_before": round(float_bytes / 2**20, 3),
            "weight_mb_after": round(packed_bytes / 2**20, 3),
            "method": p.method,
            "symmetric": p.symmetric and p.method != "hqq",
            **({"head_bits": p.head_bits, "head": heads} if (heads := self._heads(bits_of)) else {}),
            **({"layers_8bit": list(p.layers_8bit)} if p.layers_8bit else {}),
            "bits_by_node": {n: bits_of.get(n, 8) for n in taken},
            **({"integer_gemm": integer, "integer_gemm_weights": "uint8" if saturates else "int8"} if integer else {}),
            "excluded": list(p.nodes_to_exclude),
            "taken": taken,
            "not_taken": dict(sorted(not_taken.items())),
        }
        return onnx_ir.passes.PassResult(model, modified=bool(packed))

    def for_graph(self, role: GraphRole) -> QuantizeWeightOnlyPass:
        """Without ``prompt_int8`` on a decode graph (the few rows of a step stream 4-bit weights fastest)."""
        if role == "decode" and self.params.prompt_int8:
            return QuantizeWeightOnlyPass(dataclasses.replace(self.params, prompt_int8=False))
        return self

    def _heads(self, bits_of: dict[str, int]) -> list[str]:
        return [n for n in self._head_names if bits_of.get(n) != self.params.bits]

    def _bits_by_node(self, model: ir.Model, candidates: list[str]) -> dict[str, int]:
        """Each candidate's bits: ``bits``, the head's ``head_bits``, 8 for the matmuls of ``layers_8bit``."""
        p = self.params
        heads = self._head_names = head_nodes(model, candidates)
        bits_of = {n: (p.head_bits or p.bits) if n in heads else p.bits for n in candidates}
        if not p.layers_8bit:
            return bits_of
        body = [n for n in candidates if n not in heads]
        layer = layer_indices([weight_shape_by_name(model, n) for n in body], p.layers)
        if layer is None or max(p.layers_8bit) >= p.layers:
            raise OptionsError(
                f"pass weight-only: layers_8bit {list(p.layers_8bit)} needs a decoder of layers={p.layers} whose "
                f"{len(body)} weight matmuls repeat one layer's shapes: text-generation builds set layers"
            )
        return bits_of | {n: 8 for n, i in zip(body, layer, strict=True) if i in p.layers_8bit}


def _set_accuracy_level(model: Any, level: int) -> None:
    """MatMulNBits' compute type on every node (ORT's HQQ quantizer writes none: float compute)."""
    if not level:
        return
    import onnx

    for node in model.graph.node:
        if node.op_type == "MatMulNBits" and not any(a.name == "accuracy_level" for a in node.attribute):
            node.attribute.append(onnx.helper.make_attribute("accuracy_level", level))


def _source_name(node: ir.Node) -> str:
    """The MatMul a MatMulNBits node replaced (ORT's quantizer names it ``<matmul>_Q<bits>``, ``integer_gemm``
    ``<matmul>_int8``)."""
    return re.sub(r"(_Q[48]|_int8)$", "", str(node.name))


def _packed_bytes(node: ir.Node) -> int:
    """Packed weights, scales and zero points: every constant input after the activation."""
    return sum(int(v.const_value.nbytes) for v in node.inputs[1:] if v is not None and v.const_value is not None)
