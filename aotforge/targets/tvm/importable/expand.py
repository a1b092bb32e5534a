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
from onnx.backend.test.case.node import function_expand_helper

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


def expand_functions(model: onnx.ModelProto, wanted: Callable[[onnx.NodeProto], bool]) -> Counter[str]:
    """Expand, in place, every main-graph node ``wanted`` selects that has a function body; counts by op."""
    expanded: Counter[str] = Counter()
    for round_ in range(MAX_ROUNDS):
        if not any(wanted(node) for node in model.graph.node):  # shape inference costs a copy of the model
            break
        opset = _opset(model)
        types = _types(model)
        nodes: list[onnx.NodeProto] = []
        changed = False
        for k, node in enumerate(model.graph.node):
            body = function_body(node, opset, types) if wanted(node) else None
            if body is None:
                nodes.append(node)
                continue
            with_defaults = _with_defaults(node, opset)
            prefix = f"{node.name or node.op_type}_{round_}_{k}__"
            nodes.extend(function_expand_helper(with_defaults, body, prefix))
            _import_opsets(model, body)
            expanded[node.op_type] += 1
            changed = True
        if not changed:
            break
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return expanded


def _with_defaults(node: onnx.NodeProto, opset: int) -> onnx.NodeProto:
    schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    given = {a.name for a in node.attribute}
    for name, attribute in schema.attributes.items():
        if name not in given and attribute.default_value.name:
            copy.attribute.append(attribute.default_value)
    return copy


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _import_opsets(model: onnx.ModelProto, body: onnx.FunctionProto) -> None:
    have = {o.domain for o in model.opset_import}
    for entry in body.opset_import:
        if entry.domain not in have and entry.domain not in ("", "ai.onnx"):
            model.opset_import.append(entry)


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every value's type shape inference knows (context-dependent bodies are chosen by them)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # an un-inferable model still expands, with what it declares
        inferred = model
    graph = inferred.graph
    types = {v.name: v.type for v in [*graph.input, *graph.value_info, *graph.output]}
    for tensor in graph.initializer:
        types.setdefault(tensor.name, onnx.helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims)))
    return types
