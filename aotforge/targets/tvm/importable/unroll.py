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
from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
import onnx_ir.passes

from aotforge.core.onnx_values import constant_array
from aotforge.targets.tvm.importable.base import ImportStep, infer_types, opset, static_shape
from aotforge.targets.tvm.importable.nodes import Nodes

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
        counts: Counter[str] = Counter()
        for k, node in enumerate(list(graph)):
            if node.op_type not in ("Scan", "Loop") or _has_subgraphs(node.attributes["body"].as_graph()):
                continue
            tape = Nodes()
            prefix = f"{node.name or 'scan'}_{k}"
            unroll = _unroll_scan if node.op_type == "Scan" else _unroll_loop
            outputs = unroll(tape, node, prefix, version)
            if outputs is None:
                continue
            taken = [k for k, v in enumerate(node.outputs) if v.name]
            old = [node.outputs[k] for k in taken]
            new = [tape.op("Identity", [outputs[k]]) for k in taken]  # a value of its own per output
            ir.convenience.replace_nodes_and_values(graph, node, [node], tape.nodes, old, new)
            counts[node.op_type] += 1
        self.stats = dict(counts)
        return onnx_ir.passes.PassResult(model, modified=bool(counts))


def _unroll_scan(tape: Nodes, node: ir.Node, prefix: str, version: int) -> list[ir.Value] | None:
    body = node.attributes["body"].as_graph()
    m = int(node.attributes["num_scan_inputs"].as_int())
    n = len(node.inputs) - m
    k_out = len(body.outputs) - n
    in_axes = _ints(node, "scan_input_axes", m)
    in_dirs = _ints(node, "scan_input_directions", m)
    out_axes = _ints(node, "scan_output_axes", k_out)
    out_dirs = _ints(node, "scan_output_directions", k_out)
    scanned = [static_shape(v) if v is not None else None for v in node.inputs[n:]]
    if any(s is None for s in scanned):
        return None
    steps = {s[a % len(s)] for s, a in zip(scanned, in_axes, strict=True) if s is not None}
    if len(steps) != 1 or not 0 < (t_count := steps.pop()) <= MAX_STEPS:
        return None
    states: list[ir.Value | None] = list(node.inputs[:n])
    per_step: list[list[ir.Value]] = [[] for _ in range(k_out)]
    for t in range(t_count):
        slices = []
        for j, source in enumerate(node.inputs[n:]):
            index = tape.constant(np.array(t if in_dirs[j] == 0 else t_count - 1 - t, np.int64))
            slices.append(tape.op("Gather", [source, index], {"axis": in_axes[j] % len(scanned[j])}))  # type: ignore[arg-type]
        outputs = tape.copy(body, [*states, *slices], f"{prefix}__t{t}__")
        states = list(outputs[:n])
        for k in range(k_out):
            per_step[k].append(outputs[n + k])
    stacked = []
    for k, final in enumerate(node.outputs[n:]):
        values = per_step[k] if out_dirs[k] == 0 else per_step[k][::-1]
        rank = len(final.shape) if final.shape is not None else None
        axis = out_axes[k] if out_axes[k] >= 0 or rank is None else out_axes[k] + rank
        stacked.append(_stack(tape, values, axis, version))
    return [*states, *stacked]  # type: ignore[list-item]


def _unroll_loop(tape: Nodes, node: ir.Node, prefix: str, version: int) -> list[ir.Value] | None:
    body = node.attributes["body"].as_graph()
    trips = constant_array(node.inputs[0])
    cond = constant_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else np.array(True)
    if trips is None or cond is None or not bool(cond.reshape(-1)[0]) or not 0 < int(trips.reshape(-1)[0]) <= MAX_STEPS:
        return None
    cond_in, cond_out = body.inputs[1], body.outputs[0]
    producer = cond_out.producer()
    passed = cond_out is cond_in or (
        producer is not None and producer.op_type == "Identity" and list(producer.inputs) == [cond_in]
    )
    if not passed:
        return None
    n = len(node.inputs) - 2
    states: list[ir.Value | None] = list(node.inputs[2:])
    per_step: list[list[ir.Value]] = [[] for _ in range(len(body.outputs) - 1 - n)]
    for t in range(int(trips.reshape(-1)[0])):
        iteration, true = tape.constant(np.array(t, np.int64)), tape.constant(np.array(True))
        outputs = tape.copy(body, [iteration, true, *states], f"{prefix}__t{t}__")
        states = list(outputs[1 : 1 + n])
        for k, value in enumerate(outputs[1 + n :]):
            per_step[k].append(value)
    return [*states, *(_stack(tape, values, 0, version) for values in per_step)]  # type: ignore[list-item]


def _stack(tape: Nodes, values: Sequence[ir.Value], axis: int, version: int) -> ir.Value:
    """``values`` stacked along a new ``axis`` (Unsqueeze each, then Concat)."""
    if version >= 13:  # Unsqueeze's axes became an input in opset 13
        axes = tape.constant(np.array([axis], np.int64))
        stacked = [tape.op("Unsqueeze", [value, axes]) for value in values]
    else:
        stacked = [tape.op("Unsqueeze", [value], {"axes": [axis]}) for value in values]
    return tape.op("Concat", stacked, {"axis": axis})


def _ints(node: ir.Node, name: str, count: int) -> list[int]:
    found = node.attributes.get(name)
    return [int(v) for v in found.as_ints()] if found is not None else [0] * count


def _has_subgraphs(body: ir.Graph) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for b in body for a in b.attributes.values())
