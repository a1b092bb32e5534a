"""Unroll Scan and Loop ops whose trip count is static into straight-line graphs (the importer has
neither).

Each iteration's copy of the body reads the scan inputs' slice for that step (a Gather at the step)
and the previous iteration's states; the scan outputs are stacked at the end (Unsqueeze + Concat).
A Loop unrolls when its trip count is a constant and its condition can never stop it (no condition,
or a constant true one the body passes through unchanged); its iteration number is a constant per
copy. Bodies that hold subgraphs of their own are left alone, as are Scans of opset 8 (batch-major).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes
from onnx import helper, numpy_helper

from aotforge.targets.tvm.importable.base import ImportStep, infer_types, opset, static_shape
from aotforge.targets.tvm.importable.splice import Names, constants, splice

#: More steps than this stay a Scan (and the importer refuses it): an unrolled graph grows per step.
MAX_STEPS = 1024


class UnrollLoopsPass(ImportStep):
    """Unroll every main-graph Scan with static scan lengths and Loop with a static trip count; counts by op."""

    name = "unrolled"

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        graph, version = model.graph, opset(model)
        if not any(n.op_type in ("Scan", "Loop") for n in graph) or version < 9:
            return onnx_ir.passes.PassResult(model, modified=False)
        infer_types(model)
        names = Names(graph)
        shapes = {name: s for name, v in names.values.items() if (s := static_shape(v)) is not None}
        found = constants(graph)
        counts: Counter[str] = Counter()
        for k, node in enumerate(list(graph)):
            if node.op_type not in ("Scan", "Loop"):
                continue
            prefix = f"{node.name or 'scan'}_{k}"
            proto = ir.serde.serialize_node(node)
            if node.op_type == "Scan":
                unrolled = _unroll(proto, shapes, prefix, version)
            else:
                unrolled = _unroll_loop(proto, found, prefix, version)
            if unrolled is not None:
                splice(graph, node, unrolled, names)
                counts[node.op_type] += 1
        self.stats = dict(counts)
        return onnx_ir.passes.PassResult(model, modified=bool(counts))


def _unroll(
    node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]], prefix: str, opset: int
) -> list[onnx.NodeProto] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    body: onnx.GraphProto = attrs["body"]
    m = int(attrs["num_scan_inputs"])
    n = len(node.input) - m
    k_out = len(body.output) - n
    in_axes = list(attrs.get("scan_input_axes", [0] * m))
    in_dirs = list(attrs.get("scan_input_directions", [0] * m))
    out_axes = list(attrs.get("scan_output_axes", [0] * k_out))
    out_dirs = list(attrs.get("scan_output_directions", [0] * k_out))
    scanned = [shapes.get(name) for name in node.input[n:]]
    if any(s is None for s in scanned) or any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for b in body.node for a in b.attribute
    ):
        return None
    steps = {s[a % len(s)] for s, a in zip(scanned, in_axes, strict=True) if s is not None}
    if len(steps) != 1 or not 0 < (t_count := steps.pop()) <= MAX_STEPS:
        return None
    nodes: list[onnx.NodeProto] = []
    states = list(node.input[:n])
    per_step: list[list[str]] = [[] for _ in range(k_out)]
    for t in range(t_count):
        step = f"{prefix}__t{t}__"
        renamed = {v.name: states[i] for i, v in enumerate(body.input[:n])}
        for j, value in enumerate(body.input[n:]):
            index = t if in_dirs[j] == 0 else t_count - 1 - t
            position = step + f"index{j}"
            nodes.append(_constant(position, np.array(index, np.int64)))
            renamed[value.name] = step + value.name
            axis = in_axes[j] % len(scanned[j])  # type: ignore[arg-type]
            nodes.append(helper.make_node("Gather", [node.input[n + j], position], [renamed[value.name]], axis=axis))
        outputs = _copy_body(body, renamed, step, nodes)
        states = outputs[:n]
        for k in range(k_out):
            per_step[k].append(outputs[n + k])
    for i, final in enumerate(node.output[:n]):
        if final:
            nodes.append(helper.make_node("Identity", [states[i]], [final]))
    for k, final in enumerate(node.output[n:]):
        if not final:
            continue
        values = per_step[k] if out_dirs[k] == 0 else per_step[k][::-1]
        rank = len(shapes.get(final, ())) or None
        axis = out_axes[k] if out_axes[k] >= 0 or rank is None else out_axes[k] + rank
        nodes += _stack(values, final, axis, f"{prefix}__out{k}", opset)
    return nodes


def _unroll_loop(
    node: onnx.NodeProto, constants: dict[str, np.ndarray], prefix: str, opset: int
) -> list[onnx.NodeProto] | None:
    body: onnx.GraphProto = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "body")
    trips = constants.get(node.input[0]) if node.input[0] else None
    cond = constants.get(node.input[1]) if len(node.input) > 1 and node.input[1] else np.array(True)
    if trips is None or cond is None or not bool(cond.reshape(-1)[0]) or not 0 < int(trips.reshape(-1)[0]) <= MAX_STEPS:
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for b in body.node for a in b.attribute):
        return None
    cond_in, cond_out = body.input[1].name, body.output[0].name
    passed = cond_out == cond_in or any(
        b.op_type == "Identity" and list(b.input) == [cond_in] and list(b.output) == [cond_out] for b in body.node
    )
    if not passed:
        return None
    n = len(node.input) - 2
    states = list(node.input[2:])
    per_step: list[list[str]] = [[] for _ in range(len(body.output) - 1 - n)]
    nodes: list[onnx.NodeProto] = []
    for t in range(int(trips.reshape(-1)[0])):
        step = f"{prefix}__t{t}__"
        renamed = {v.name: states[i] for i, v in enumerate(body.input[2:])}
        renamed[body.input[0].name], renamed[cond_in] = step + "iteration", step + "cond"
        nodes.append(_constant(step + "iteration", np.array(t, np.int64)))
        nodes.append(_constant(step + "cond", np.array(True)))
        outputs = _copy_body(body, renamed, step, nodes)
        states = outputs[1 : 1 + n]
        for k, value in enumerate(outputs[1 + n :]):
            per_step[k].append(value)
    for i, final in enumerate(node.output[:n]):
        if final:
            nodes.append(helper.make_node("Identity", [states[i]], [final]))
    for k, final in enumerate(node.output[n:]):
        if final:
            nodes += _stack(per_step[k], final, 0, f"{prefix}__out{k}", opset)
    return nodes


def _copy_body(body: onnx.GraphProto, renamed: dict[str, str], step: str, nodes: list[onnx.NodeProto]) -> list[str]:
    """One iteration's copy of ``body`` appended to ``nodes`` (values renamed per step); its output names."""
    for tensor in body.initializer:
        renamed[tensor.name] = step + tensor.name
        nodes.append(_constant(renamed[tensor.name], numpy_helper.to_array(tensor)))
    for b in body.node:
        for name in b.output:
            if name:
                renamed[name] = step + name
    for b in body.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(b)
        copy.name = step + b.name
        copy.ClearField("input")
        copy.ClearField("output")
        copy.input.extend(renamed.get(x, x) for x in b.input)
        copy.output.extend(renamed.get(x, x) for x in b.output)
        nodes.append(copy)
    return [renamed.get(v.name, v.name) for v in body.output]


def _stack(values: list[str], final: str, axis: int, prefix: str, opset: int) -> list[onnx.NodeProto]:
    """``values`` stacked along a new ``axis`` into ``final`` (Unsqueeze each, then Concat)."""
    nodes, stacked, axes = [], [], f"{prefix}_axis"
    if opset >= 13:  # Unsqueeze's axes became an input in opset 13
        nodes.append(_constant(axes, np.array([axis], np.int64)))
    for t, value in enumerate(values):
        stacked.append(f"{prefix}_t{t}")
        if opset >= 13:
            nodes.append(helper.make_node("Unsqueeze", [value, axes], [stacked[-1]]))
        else:
            nodes.append(helper.make_node("Unsqueeze", [value], [stacked[-1]], axes=[axis]))
    nodes.append(helper.make_node("Concat", stacked, [final], axis=axis))
    return nodes


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))
