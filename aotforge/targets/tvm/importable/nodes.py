"""The nodes one replacement is made of, in order: built op by op, or copied from a subgraph."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx_ir as ir


class Nodes:
    """New nodes, outside any graph until the step puts them in place of the node they replace."""

    def __init__(self) -> None:
        self.nodes: list[ir.Node] = []

    def op(
        self, op_type: str, inputs: Sequence[ir.Value | None], attributes: Mapping[str, Any] | None = None
    ) -> ir.Value:
        node = ir.Node("", op_type, inputs, ir.convenience.convert_attributes(attributes or {}), num_outputs=1)
        self.nodes.append(node)
        return node.outputs[0]

    def constant(self, value: np.ndarray) -> ir.Value:
        return self.op("Constant", [], {"value": ir.tensor(value)})

    def copy(self, body: ir.Graph, inputs: Sequence[ir.Value | None], prefix: str) -> list[ir.Value]:
        """A copy of ``body``'s nodes reading ``inputs`` in place of its inputs (values of the graph around it as
        they are), its names prefixed with ``prefix``; the copy's outputs."""
        copy = body.clone(allow_outer_scope_values=True)
        for formal, actual in zip(copy.inputs, inputs, strict=True):
            if actual is not None:
                ir.convenience.replace_all_uses_with(formal, actual, replace_graph_outputs=True)
            elif formal.uses():
                raise ValueError(f"body input {formal.name!r} is read but not given")
        for name, value in copy.initializers.items():  # a body's initializers: constants of the copy
            constant = self.op("Constant", [], {"value": value.const_value})
            constant.name = prefix + name
            ir.convenience.replace_all_uses_with(value, constant, replace_graph_outputs=True)
        outputs = list(copy.outputs)
        nodes = list(copy)
        copy.outputs.clear()
        copy.remove(nodes)
        for node in nodes:
            node.name = prefix + (node.name or node.op_type)
            for value in node.outputs:
                value.name = prefix + value.name if value.name else None
        self.nodes.extend(nodes)
        return outputs
