"""Expand ONNX function ops into the function bodies their schemas carry.

Ops such as SoftmaxCrossEntropyLoss, RMSNormalization, RotaryEmbedding or Attention-23 are defined
by ONNX as functions of simpler ops (``OpSchema.get_function_with_opset_version`` and, where the
body depends on types or attributes, ``get_context_dependent_function_with_opset_version``). A
target that lacks one can take the body instead: this is what onnx's own ``*_expanded`` test
models are (``onnx.backend.test.case.node.function_expand_helper``, which does the renaming here).
The body picked is the newest one at or below the model's opset, so its ops mean what they say in
the model. Only the main graph is expanded (subgraph nodes stay as they are).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import onnx
import onnx_ir as ir
import onnx_ir.passes
from onnx.backend.test.case.node import function_expand_helper

from aotforge.targets.tvm.importable.base import ImportStep, infer_types, opset
from aotforge.targets.tvm.importable.splice import Names, splice

#: How many times a body may itself be expanded (nested function ops).
MAX_ROUNDS = 4


def function_body(node: onnx.NodeProto, opset: int, types: dict[str, onnx.TypeProto]) -> onnx.FunctionProto | None:
    """The function body that defines ``node`` at ``opset``, or None when its schema has none."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        return None
    # onnx's stubs lack these OpSchema members (onnx's own test helper ignores the same way)
    plain = [v for v in schema.function_opset_versions if v <= opset]  # type: ignore[attr-defined]
    context = [v for v in schema.context_dependent_function_opset_versions if v <= opset]  # type: ignore[attr-defined]
    if not plain and not context:
        return None
    with_defaults = _with_defaults(node, opset)
    body = onnx.FunctionProto()
    if context and (not plain or max(context) >= max(plain)):
        input_types = [types.get(name, onnx.TypeProto()).SerializeToString() for name in node.input]
        text = schema.get_context_dependent_function_with_opset_version(  # type: ignore[attr-defined]
            max(context), with_defaults.SerializeToString(), input_types
        )
    else:
        text = schema.get_function_with_opset_version(max(plain))  # type: ignore[attr-defined]
    body.ParseFromString(text)
    return body if body.node else None


class ExpandFunctionsPass(ImportStep):
    """Expand every main-graph node ``wanted`` selects that has a function body; counts by op."""

    name = "expanded"

    def __init__(self, wanted: Callable[[ir.Node], bool]) -> None:
        super().__init__()
        self.wanted = wanted

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        expanded: Counter[str] = Counter()
        graph = model.graph
        for round_ in range(MAX_ROUNDS):
            if not any(self.wanted(node) for node in graph):  # shape inference costs a copy of the model
                break
            version = opset(model)
            infer_types(model)
            names = Names(graph)
            changed = False
            for k, node in enumerate(list(graph)):
                if not self.wanted(node):
                    continue
                proto = ir.serde.serialize_node(node)
                types = {v.name: ir.serde.serialize_value(v).type for v in node.inputs if v is not None and v.type}
                body = function_body(proto, version, types)
                if body is None:
                    continue
                prefix = f"{node.name or node.op_type}_{round_}_{k}__"
                splice(graph, node, function_expand_helper(_with_defaults(proto, version), body, prefix), names)
                for entry in body.opset_import:
                    if entry.domain not in model.opset_imports and entry.domain not in ("", "ai.onnx"):
                        model.opset_imports[entry.domain] = entry.version
                expanded[node.op_type] += 1
                changed = True
            if not changed:
                break
        self.stats = dict(expanded)
        return onnx_ir.passes.PassResult(model, modified=bool(expanded))


def _with_defaults(node: onnx.NodeProto, opset: int) -> onnx.NodeProto:
    schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    given = {a.name for a in node.attribute}
    for name, attribute in schema.attributes.items():
        if name not in given and attribute.default_value.name:
            copy.attribute.append(attribute.default_value)
    return copy
