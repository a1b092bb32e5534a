"""The MatMul and Gemm weights a weight-only pass can take: which nodes (``survey``, ``head_nodes``) and the
rewrites that give each one a constant 2-D ``[K, N]`` weight (``transposed_weights_as_constants``,
``gemms_as_matmuls``), the form ONNX Runtime's MatMulNBits quantizer and ``integer_gemm`` both take."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from aotforge.core.onnx_values import add_initializer


def weight_shape(node: ir.Node) -> tuple[object, ...] | None:
    """The shape of ``node``'s constant weight (input 1), or None when it is computed at run time."""
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if weight is None or weight.const_value is None:
        return None
    return tuple(weight.const_value.shape)


def _gemm_refusal(node: ir.Node) -> str | None:
    """Why a Gemm cannot become ``MatMul(A, B) + C`` with a constant 2-D B (None: it can)."""
    attrs = node.attributes
    if attrs.get_int("transA", 0) or attrs.get_float("alpha", 1.0) != 1.0:
        return "Gemm with transA or alpha != 1"
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None and (bias.const_value is None or attrs.get_float("beta", 1.0) != 1.0):
        return "Gemm whose bias is computed at run time or scaled (beta != 1)"
    return None


def survey(model: ir.Model, exclude: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """Which MatMul / Gemm nodes MatMulNBits can replace, and why each of the others cannot.

    A Gemm (``torch.nn.Linear`` of a 2-D activation, a decoder's LM head, tied or not) is taken as
    ``MatMul`` against its constant weight (transposed at compile time when ``transB``) plus its bias."""
    taken: list[str] = []
    not_taken: dict[str, str] = {}
    for node in model.graph:
        if node.op_type not in ("MatMul", "Gemm") or node.domain not in ("", "ai.onnx"):
            continue
        name, shape = str(node.name), weight_shape(node)
        reason = _gemm_refusal(node) if node.op_type == "Gemm" else None
        if name in exclude:
            reason = "excluded (nodes_to_exclude)"
        elif shape is None:
            reason = "weight computed at run time (activation x activation)"
        elif len(shape) != 2:
            reason = f"weight of rank {len(shape)}, not a 2-D matrix"
        if reason is None:
            taken.append(name)
        else:
            not_taken[name] = reason
    return taken, not_taken


def head_nodes(model: ir.Model, names: list[str]) -> list[str]:
    """The named MatMuls whose output, or its bias ``Add``'s, is a graph output: a decoder's LM head."""
    heads = []
    for node in model.graph:
        if node.op_type != "MatMul" or str(node.name) not in names:
            continue
        out = node.outputs[0]
        biased = [u.node.outputs[0] for u in out.uses() if u.node.op_type == "Add"]
        if out.is_graph_output() or any(v.is_graph_output() for v in biased):
            heads.append(str(node.name))
    return heads


def transposed_weights_as_constants(model: ir.Model) -> int:
    """``MatMul(A, Transpose(W))`` with ``W`` a constant 2-D weight as ``MatMul(A, W^T)`` against a constant: how
    the exporter writes a tied LM head over a 3-D activation (a verify graph's logits at every position), which
    would otherwise stay float as a weight "computed at run time". ``W^T`` is named as ``gemms_as_matmuls`` names
    the 2-D head's, so every graph of a build quantizes the same bytes. Returns the MatMuls rewritten."""
    graph, done = model.graph, 0
    for node in [n for n in graph if n.op_type == "MatMul" and n.domain in ("", "ai.onnx")]:
        transpose = node.inputs[1].producer() if len(node.inputs) == 2 and node.inputs[1] is not None else None
        if transpose is None or transpose.op_type != "Transpose" or transpose.domain not in ("", "ai.onnx"):
            continue
        weight, perm = transpose.inputs[0], transpose.attributes.get_ints("perm", None)
        if weight is None or weight.const_value is None or len(weight.const_value.shape) != 2:
            continue
        if perm is not None and list(perm) != [1, 0]:
            continue
        name = f"{weight.name}_kn"
        if name not in graph.initializers:
            add_initializer(graph, name, np.ascontiguousarray(weight.const_value.numpy().T))
        node.replace_input_with(1, graph.initializers[name])
        if not transpose.outputs[0].uses() and not transpose.outputs[0].is_graph_output():
            graph.remove(transpose, safe=True)
        done += 1
    return done


def gemms_as_matmuls(model: ir.Model, names: list[str]) -> None:
    """Rewrite the named Gemms as ``MatMul(A, B or B^T)`` (+ ``Add(C)``), the MatMul keeping the Gemm's name."""
    graph = model.graph
    for node in [n for n in graph if n.op_type == "Gemm" and str(n.name) in names]:
        weight = node.inputs[1]
        assert weight is not None and weight.const_value is not None
        array = weight.const_value.numpy()
        if node.attributes.get_int("transB", 0):
            array = np.ascontiguousarray(array.T)
        name = f"{weight.name}_kn" if f"{weight.name}_kn" not in graph.initializers else f"{node.name}_weight_kn"
        matrix = add_initializer(graph, name, array)
        new = [ir.node("MatMul", [node.inputs[0], matrix], name=str(node.name))]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        if bias is not None:
            new.append(ir.node("Add", [new[0].outputs[0], bias], name=f"{node.name}_bias"))
        ir.convenience.replace_nodes_and_values(graph, node, [node], new, [node.outputs[0]], [new[-1].outputs[0]])
        if (
            not weight.uses() and weight.name is not None and weight.name in graph.initializers
        ):  # a tied head: the embedding still reads it
            del graph.initializers[weight.name]


def weight_shape_by_name(model: ir.Model, node_name: str) -> tuple[object, ...]:
    node = next(n for n in model.graph if str(n.name) == node_name)
    return weight_shape(node) or ()


def weight_bytes(model: ir.Model, node_name: str) -> int:
    node = next(n for n in model.graph if str(n.name) == node_name)
    weight = node.inputs[1]
    assert weight is not None and weight.const_value is not None
    return int(weight.const_value.nbytes)
