"""fp16 / bf16 conversion of the IR, with numerically sensitive ops kept in fp32 behind Casts.

Which inputs and outputs of a node change dtype is read from the node's ONNX schema: a slot
converts when its type parameter allows the target type (so ``Resize`` scales or ``Cast``'s
``to`` stay as they are). Casts go where a converted value meets an fp32 consumer or the other
way round; ONNX Runtime folds the ones on initializers at load time. Precision lives in the graph
(strongly typed), which TensorRT 10+ needs since it dropped its FP16 builder flag.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes
import onnx_ir.passes.common as common

from aotforge.passes.base import GraphPass

#: Ops whose output dtype comes from an attribute, not from their inputs: never retyped.
_ATTRIBUTE_TYPED = frozenset(
    {"Cast", "Constant", "ConstantOfShape", "EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike"}
    | {"RandomUniformLike", "Multinomial", "Bernoulli"}
)
_FP16_MAX = 65504.0


@dataclasses.dataclass(frozen=True)
class ConvertPrecisionParams:
    #: Ops left in fp32 (their reductions lose too much in 16 bits: ReduceL2 summing squares in
    #: bf16, as tvm does, left MiniLM's normalised embedding visibly short of unit length).
    keep_fp32_ops: tuple[str, ...] = (
        "LayerNormalization",
        "Softmax",
        "LogSoftmax",
        "ReduceMean",
        "ReduceSum",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "InstanceNormalization",
        "GroupNormalization",
        "RMSNormalization",
        "Pow",
        "Exp",
    )
    #: Node names left in fp32 in addition to the ops above.
    keep_fp32_nodes: tuple[str, ...] = ()
    #: True keeps graph inputs and outputs fp32 (Casts inside); False retypes them too.
    keep_io_types: bool = True


class _ConvertPrecisionPass(GraphPass):
    Params = ConvertPrecisionParams
    changes_numerics = True
    target: ClassVar[ir.DataType]

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        if any(v.dtype is None for n in model.graph for v in n.outputs):
            common.ShapeInferencePass()(model)
        plan = {node: slots for node in model.graph if (slots := self._slots(node, model)) is not None}
        changed = _retype_outputs(plan, self.target)
        if not self.params.keep_io_types:
            for value in model.graph.inputs:
                if value.dtype == ir.DataType.FLOAT:
                    value.dtype = self.target
                    changed.add(value)
        initializers = _convert_initializers(model, plan, self.target, changed)
        casts = _insert_casts(model, plan, changed, self.target)
        casts += _fix_outputs(model, self.target, self.params.keep_io_types)
        kept: dict[str, int] = {}
        for node in model.graph:
            if node not in plan and node.op_type in self.params.keep_fp32_ops:
                kept[node.op_type] = kept.get(node.op_type, 0) + 1
        self.stats = {
            "nodes_converted": len(plan),
            "initializers_converted": initializers,
            "casts_inserted": casts,
            "kept_fp32": kept,
        }
        return onnx_ir.passes.PassResult(model, modified=bool(plan or casts))

    def _slots(self, node: ir.Node, model: ir.Model) -> tuple[set[int], set[int]] | None:
        """(input indices, output indices) that change to the target type, or None to keep the node."""
        p = self.params
        if node.op_type in p.keep_fp32_ops or node.name in p.keep_fp32_nodes or node.op_type in _ATTRIBUTE_TYPED:
            return None
        if node.domain not in ("", "ai.onnx") or any(
            a.type == ir.AttributeType.GRAPH for a in node.attributes.values()
        ):
            return None
        try:
            schema = onnx.defs.get_schema(node.op_type, model.opset_imports.get("", 1), "")
        except onnx.defs.SchemaError:
            return None
        allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
        target = f"tensor({_TYPE_STR[self.target]})"
        inputs = _float_slots(node.inputs, schema.inputs, allowed, target)
        outputs = _float_slots(node.outputs, schema.outputs, allowed, target)
        if inputs is None or outputs is None or not (inputs or outputs):
            return None
        return inputs, outputs


_TYPE_STR = {ir.DataType.FLOAT16: "float16", ir.DataType.BFLOAT16: "bfloat16"}


def _float_slots(values, formals, allowed, target: str) -> set[int] | None:
    """Indices of fp32 values whose type parameter allows ``target``; None if an fp32 value's type is unknown."""
    slots = set()
    for i, value in enumerate(values):
        if value is None or not formals:
            continue
        type_str = formals[min(i, len(formals) - 1)].type_str
        if value.dtype is None and type_str in allowed:
            return None
        if value.dtype == ir.DataType.FLOAT and target in allowed.get(type_str, ()):
            slots.add(i)
    return slots


def _retype_outputs(plan, target: ir.DataType) -> set[ir.Value]:
    changed = set()
    for node, (_, outputs) in plan.items():
        for i in outputs:
            node.outputs[i].dtype = target
            changed.add(node.outputs[i])
    return changed


def _convert_initializers(model: ir.Model, plan, target: ir.DataType, changed: set[ir.Value]) -> int:
    """Convert fp32 initializers that only converted slots read (shared ones stay fp32 behind a Cast)."""
    count = 0
    for value in model.graph.initializers.values():
        if value.dtype != ir.DataType.FLOAT or value.const_value is None or value in model.graph.outputs:
            continue
        uses = list(value.uses())
        if uses and all(u.node in plan and u.idx in plan[u.node][0] for u in uses):
            array = value.const_value.numpy()
            if target == ir.DataType.FLOAT16:
                array = np.clip(array, -_FP16_MAX, _FP16_MAX).astype(np.float16)
            else:
                array = array.astype(ml_dtypes.bfloat16)
            value.const_value = ir.Tensor(array, name=value.name)
            value.dtype = target
            changed.add(value)
            count += 1
    return count


def _insert_casts(model: ir.Model, plan, changed: set[ir.Value], target: ir.DataType) -> int:
    """Cast wherever a consumer expects another type than its input now has."""
    cache: dict[tuple[ir.Value, ir.DataType], ir.Value] = {}
    for node in list(model.graph.all_nodes()):
        for i, value in enumerate(node.inputs):
            if value is None:
                continue
            converted_slot = node in plan and i in plan[node][0]
            if converted_slot and value.dtype == ir.DataType.FLOAT:
                node.replace_input_with(i, _cast(model.graph, value, target, cache))
            elif not converted_slot and value in changed:
                node.replace_input_with(i, _cast(model.graph, value, ir.DataType.FLOAT, cache))
    return len(cache)


def _fix_outputs(model: ir.Model, target: ir.DataType, keep_io_types: bool) -> int:
    """Graph outputs get the requested IO type behind a Cast that takes over their names."""
    graph, casts = model.graph, 0
    want, other = (ir.DataType.FLOAT, target) if keep_io_types else (target, ir.DataType.FLOAT)
    for index, value in enumerate(graph.outputs):
        if value.dtype != other:
            continue
        name, value.name = value.name, _unique(graph, f"{value.name}_{other.name.lower()}")
        cast = ir.node("Cast", [value], {"to": int(want)}, name=f"{name}_cast")
        cast.outputs[0].name, cast.outputs[0].dtype, cast.outputs[0].shape = name, want, value.shape
        graph.outputs[index] = cast.outputs[0]
        graph.append(cast)
        casts += 1
    return casts


def _cast(graph: ir.Graph, value: ir.Value, to: ir.DataType, cache) -> ir.Value:
    """One Cast of ``value`` to ``to`` per graph, placed right after where ``value`` is defined."""
    if (value, to) in cache:
        return cache[(value, to)]
    name = _unique(graph, f"{value.name}_to_{to.name.lower()}")
    cast = ir.node("Cast", [value], {"to": int(to)}, name=name)
    cast.outputs[0].name, cast.outputs[0].dtype, cast.outputs[0].shape = name, to, value.shape
    producer = value.producer()
    if producer is not None and producer.graph is graph:
        graph.insert_after(producer, cast)
    else:
        graph.insert_before(graph[0], cast)
    cache[(value, to)] = cast.outputs[0]
    return cast.outputs[0]


def _unique(graph: ir.Graph, name: str) -> str:
    taken = {v.name for n in graph for v in n.outputs} | {v.name for v in graph.inputs} | set(graph.initializers)
    candidate, k = name, 1
    while candidate in taken:
        candidate, k = f"{name}_{k}", k + 1
    return candidate


class ConvertToFloat16Pass(_ConvertPrecisionPass):
    name = "fp16"
    target = ir.DataType.FLOAT16


class ConvertToBFloat16Pass(_ConvertPrecisionPass):
    name = "bf16"
    target = ir.DataType.BFLOAT16
