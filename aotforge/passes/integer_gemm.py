"""MatMuls against constant weights as 8-bit integer GEMM: ONNX Runtime's ``MatMulInteger`` (MLAS QGEMM, VNNI).

At many rows (a prompt of a hundred tokens or more) MatMulNBits' int8-compute kernel runs no faster than a float
GEMM, where MLAS's u8 x s8 QGEMM runs several times faster (docs/benchmarks.md); at one row a step streams its
weights and 4 bits win. So a decoder's prompt graphs may take this form while its decode graph keeps MatMulNBits.

Weights: int8, symmetric, one scale per output column; where this CPU's u8 x s8 GEMM saturates (``integer_range``)
they go in as uint8 shifted by 128 with that zero point (MLAS's u8 x u8 GEMM adds its products in int32): the
same values and results, without the saturation. Activations: int8 per row (one scale per token, its
largest magnitude over K mapped to 127), shifted by 128 to the uint8 the fast kernel takes. A row's result
depends on that row alone (int32 accumulation is exact, the scales are its own), so a prompt gives the same
values whole or in chunks and whatever else shares the batch, which a per-tensor scale
(``DynamicQuantizeMatMul``) would not.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aotforge.core.onnx_values import add_initializer


def int8_per_column(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(int8 [K, N], scale [N])`` with ``weight ~= int8 * scale``, each column's largest magnitude at 127."""
    scale = np.abs(weight).max(axis=0) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return np.clip(np.rint(weight / scale), -127, 127).astype(np.int8), scale


def integer_gemm(graph: ir.Graph, node: ir.Node, unsigned_weights: bool = False) -> None:
    """Replace ``node`` (``MatMul(A, W)``, W a constant 2-D float weight) by the integer GEMM of the module
    docstring (``unsigned_weights``: its weights as uint8 around 128); its output value keeps its name and uses."""
    activation, weight = node.inputs[0], node.inputs[1]
    assert activation is not None and weight is not None and weight.const_value is not None
    quantized, scale = int8_per_column(weight.const_value.numpy().astype(np.float32))
    if unsigned_weights:
        w = add_initializer(
            graph, f"{weight.name}_uint8", (quantized.astype(np.int16) + 128).astype(np.uint8), share=True
        )
    else:
        w = add_initializer(graph, f"{weight.name}_int8", quantized, share=True)
    w_scale = add_initializer(graph, f"{weight.name}_int8_scale", scale, share=True)
    inv = add_initializer(graph, "integer_gemm_inv127", np.array(1 / 127, np.float32), share=True)
    # An all-zero row: 0, not NaN.
    tiny = add_initializer(graph, "integer_gemm_tiny", np.array(1e-30, np.float32), share=True)
    shift = add_initializer(graph, "integer_gemm_128", np.array(128, np.float32), share=True)
    zero = add_initializer(graph, "integer_gemm_zero_point", np.array(128, np.uint8), share=True)
    name = str(node.name)
    magnitude = ir.node("Abs", [activation], name=f"{name}_abs")
    if graph.opset_imports.get("", 18) >= 18:  # the axes an input from opset 18, an attribute before
        axes = add_initializer(graph, "integer_gemm_axes", np.array([-1], np.int64), share=True)
        peak = ir.node("ReduceMax", [magnitude.outputs[0], axes], {"keepdims": 1}, name=f"{name}_peak")
    else:
        peak = ir.node("ReduceMax", [magnitude.outputs[0]], {"keepdims": 1, "axes": [-1]}, name=f"{name}_peak")
    row_scale = ir.node("Mul", [peak.outputs[0], inv], name=f"{name}_row_scale")
    safe = ir.node("Max", [row_scale.outputs[0], tiny], name=f"{name}_row_scale_safe")
    scaled = ir.node("Div", [activation, safe.outputs[0]], name=f"{name}_scaled")
    rounded = ir.node("Round", [scaled.outputs[0]], name=f"{name}_round")
    shifted = ir.node("Add", [rounded.outputs[0], shift], name=f"{name}_shift")
    as_u8 = ir.node("Cast", [shifted.outputs[0]], {"to": ir.DataType.UINT8}, name=f"{name}_u8")
    gemm_inputs = [as_u8.outputs[0], w, zero, *([zero] if unsigned_weights else [])]
    gemm = ir.node("MatMulInteger", gemm_inputs, name=f"{name}_int8")
    as_float = ir.node("Cast", [gemm.outputs[0]], {"to": ir.DataType.FLOAT}, name=f"{name}_float")
    by_column = ir.node("Mul", [as_float.outputs[0], w_scale], name=f"{name}_column_scale")
    by_row = ir.node("Mul", [by_column.outputs[0], safe.outputs[0]], name=f"{name}_scaled_back")
    new = [magnitude, peak, row_scale, safe, scaled, rounded, shifted, as_u8, gemm, as_float, by_column, by_row]
    ir.convenience.replace_nodes_and_values(graph, node, [node], new, [node.outputs[0]], [by_row.outputs[0]])
    if not weight.uses() and weight.name is not None and weight.name in graph.initializers:
        del graph.initializers[weight.name]


def integer_gemms(model: ir.Model, names: list[str], unsigned_weights: bool = False) -> list[str]:
    """The MatMuls of ``names`` (constant 2-D weights) as integer GEMM; the names rewritten."""
    nodes = [n for n in model.graph if str(n.name) in set(names) and n.op_type == "MatMul"]
    for node in nodes:
        integer_gemm(model.graph, node, unsigned_weights)
    return [str(n.name) for n in nodes]
