"""Where a step still writes its replacement as ONNX nodes: those nodes spliced into the IR in place of one node.

The expand, unroll, narrow and legalize steps build their replacements with ``onnx.helper`` (onnx's own
function-body expansion hands out ``NodeProto``s); :func:`splice` puts them into the ``onnx_ir`` graph
in place of the node they replace, so the model itself is never serialized between steps. Names
connect them: an input names a value of the main graph (or one an earlier replacement node made),
and the outputs named as the replaced node's take over its uses.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import onnx_ir as ir


class Names:
    """The main graph's values by name, and fresh names beside them."""

    def __init__(self, graph: ir.Graph) -> None:
        self.values: dict[str, ir.Value] = {}
        for value in [*graph.inputs, *graph.initializers.values()]:
            if value.name:
                self.values[value.name] = value
        for node in graph:
            for value in node.outputs:
                if value.name:
                    self.values[value.name] = value
        self.taken = set(self.values)

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


def splice(graph: ir.Graph, node: ir.Node, protos: Sequence[onnx.NodeProto], names: Names) -> list[ir.Node]:
    """Replace ``node`` by ``protos`` in ``graph`` (see the module's docstring); the new nodes."""
    made: dict[str, ir.Value] = {}
    nodes = []
    for proto in protos:
        inputs = [_lookup(name, made, names) for name in proto.input]
        attributes = [_attribute(a, made, names) for a in proto.attribute]
        new = ir.Node(
            proto.domain,
            proto.op_type,
            inputs,
            attributes,
            overload=proto.overload,
            num_outputs=len(proto.output),
            name=proto.name or None,
        )
        for value, name in zip(new.outputs, proto.output, strict=True):
            value.name = name or None
            if name:
                made[name] = value
        nodes.append(new)
    old = [v for v in node.outputs if v.name and v.name in made]
    new_values = [made[str(v.name)] for v in old]
    missing = [v.name for v in node.outputs if v.name and v.name not in made and (v.uses() or v.is_graph_output())]
    if missing:
        raise ValueError(f"the replacement of {node.op_type} node {node.name!r} does not compute {missing}")
    for value in old:  # the old values give up their names to the new ones
        value.name = None
    ir.convenience.replace_nodes_and_values(graph, node, [node], nodes, old, new_values)
    for name, value in made.items():
        value.name = name
        names.values[name] = value
        names.taken.add(name)
    return nodes


def _attribute(proto: onnx.AttributeProto, made: dict[str, ir.Value], names: Names) -> ir.Attr:
    if proto.type not in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return ir.serde.deserialize_attribute(proto)
    # A subgraph reads values of the graph around it by name: it is deserialized in that scope (the public
    # deserialize_attribute gives it none).
    return ir.serde._deserialize_attribute(proto, [{**names.values, **made}])


def _lookup(name: str, made: dict[str, ir.Value], names: Names) -> ir.Value | None:
    if not name:
        return None
    if name in made:
        return made[name]
    if name in names.values:
        return names.values[name]
    raise ValueError(f"a replacement node reads {name!r}, which no node computes")


def constants(graph: ir.Graph) -> dict[str, np.ndarray]:
    """The main graph's constant values by name (initializers and Constant nodes' tensors)."""
    found = {
        name: v.const_value.numpy() for name, v in graph.initializers.items() if v.const_value is not None and name
    }
    for node in graph:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and "value" in node.attributes:
            if node.outputs[0].name:
                found[node.outputs[0].name] = node.attributes["value"].as_tensor().numpy()
    return found
