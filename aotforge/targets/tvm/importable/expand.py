"""Expand ONNX function ops into the function bodies their schemas carry.

Ops such as SoftmaxCrossEntropyLoss, RMSNormalization, RotaryEmbedding or Attention-23 are defined
by ONNX as functions of simpler ops (``OpSchema.get_function_with_opset_version`` and, where the
body depends on types or attributes, ``get_context_dependent_function_with_opset_version``). A
target that lacks one can take the body instead: this is what onnx's own ``*_expanded`` test
models are. Here the node calls its body as a model-local function, which onnx-ir's ``InlinePass``
inlines (attribute references bound, names made unique).
The body picked is the newest one at or below the model's opset, so its ops mean what they say in
the model. Only the main graph is expanded (subgraph nodes stay as they are).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import onnx
import onnx_ir as ir
import onnx_ir.passes
import onnx_ir.passes.common

from aotforge.targets.tvm.importable.base import ImportStep, infer_types, opset

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


#: The domain a node to expand is moved to while onnx-ir's InlinePass replaces it by its body.
_EXPANDING = "aotforge.expanding"


class ExpandFunctionsPass(ImportStep):
    """Expand every main-graph node ``wanted`` selects that has a function body; counts by op.

    Each such node calls its body as a model-local function of its own, which onnx-ir's ``InlinePass``
    then inlines (attributes bound, names made unique); the functions leave the model with it.
    """

    name = "expanded"

    def __init__(self, wanted: Callable[[ir.Node], bool]) -> None:
        super().__init__()
        self.wanted = wanted

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        expanded: Counter[str] = Counter()
        for round_ in range(MAX_ROUNDS):
            if not any(self.wanted(node) for node in model.graph):  # shape inference costs a copy of the model
                break
            infer_types(model)
            calls = [
                _call_body(model, node, f"{round_}_{k}") for k, node in enumerate(model.graph) if self.wanted(node)
            ]
            if not any(calls):
                break
            expanded.update(op for op in calls if op)
            onnx_ir.passes.common.InlinePass(lambda f: f.domain == _EXPANDING)(model)
            model.opset_imports.pop(_EXPANDING, None)
        self.stats = dict(expanded)
        return onnx_ir.passes.PassResult(model, modified=bool(expanded))


def _call_body(model: ir.Model, node: ir.Node, overload: str) -> str | None:
    """``node`` made a call of its function body, added to the model's functions; its op, or None if it has none."""
    version = opset(model)
    proto = ir.serde.serialize_node(node)
    types = {str(v.name): ir.serde.serialize_value(v).type for v in node.inputs if v is not None and v.type}
    body = function_body(proto, version, types)
    if body is None:
        return None
    op_type = node.op_type
    del body.output[len(node.outputs) :]  # a body may name outputs it computes only for calls that take them
    body.domain, body.name, body.overload = _EXPANDING, op_type, overload
    del body.opset_import[:]  # the body picked is the newest at or below the model's opset: its ops mean the same
    body.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items())
    function = ir.serde.deserialize_function(body)
    model.functions[function.identifier()] = function
    for attribute in _with_defaults(proto, version).attribute:
        if attribute.name not in node.attributes:
            node.attributes[attribute.name] = ir.serde.deserialize_attribute(attribute)
    node.domain, node.overload = _EXPANDING, overload
    model.opset_imports.setdefault(_EXPANDING, 1)
    return op_type


def _with_defaults(node: onnx.NodeProto, opset: int) -> onnx.NodeProto:
    schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    given = {a.name for a in node.attribute}
    for name, attribute in schema.attributes.items():
        if name not in given and attribute.default_value.name:
            copy.attribute.append(attribute.default_value)
    return copy
