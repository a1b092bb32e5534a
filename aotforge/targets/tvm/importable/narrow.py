"""float8 / 4-bit / 2-bit values carried as their bytes (uint8), their casts as table look-ups.

TVM 0.27 converts float8 wrongly (infinities, NaN, saturation, -0) and its runtime holds sub-byte
integers packed where numpy (``ml_dtypes``) holds one per byte. So, when every such value of the
main graph only enters or leaves through a Cast / CastLike (or is a graph input, output or
initializer), each becomes a uint8 holding the ``ml_dtypes`` byte (the runner views the arrays),
and each cast is rewritten into ops TVM imports exactly:

- from a narrow type: ``Gather(table, bits)``, the table being the 256 bytes decoded as the
  reference decodes them (``ml_dtypes``) into the cast's target type;
- to a narrow type (from float / float16 / bfloat16): a binary search of the value (as float32,
  exact from those) among the float32 breakpoints where the reference's cast
  (``onnx.reference``'s ``cast_to``: saturate, round_mode, NaN and -0 as ONNX defines them)
  changes its byte, then ``Gather(bytes, index)``; NaN and -0 are placed by ``IsNaN`` and
  ``1 / x < 0``.

A graph where a narrow value meets any other op is left alone (the coverage check refuses it).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes

from aotforge.targets.tvm.importable.base import ImportStep, copy_of, infer_types
from aotforge.targets.tvm.importable.narrow_encoding import encoding, numpy_dtype
from aotforge.targets.tvm.importable.nodes import Nodes

T = onnx.TensorProto
#: Element types numpy holds one per byte through ml_dtypes and TVM cannot compute with as ONNX does.
NARROW = frozenset(
    getattr(T, name)
    for name in (
        "FLOAT8E4M3FN",
        "FLOAT8E4M3FNUZ",
        "FLOAT8E5M2",
        "FLOAT8E5M2FNUZ",
        "FLOAT8E8M0",
        "INT4",
        "UINT4",
        "FLOAT4E2M1",
        "INT2",
        "UINT2",
    )
    if hasattr(T, name)
)
#: Sources a cast to a narrow float is encoded from (each converts to float32 exactly).
_ENCODABLE = (T.FLOAT, T.FLOAT16, T.BFLOAT16)
_FLOAT8 = frozenset(t for t in NARROW if "FLOAT" in T.DataType.Name(t))
_DECODE_TO = frozenset(
    (T.FLOAT, T.FLOAT16, T.BFLOAT16, T.DOUBLE, T.INT8, T.UINT8, T.INT16, T.UINT16, T.INT32, T.UINT32)
    + (T.INT64, T.UINT64, T.BOOL)
)


class NarrowTypesPass(ImportStep):
    """Narrow values as their bytes when every one is a cast's (see the module's docstring); counts of what was
    rewritten. Before the first fold: onnxscript's CastLike rule drops saturate=0, which matters for float8 only."""

    name = "narrow_types"
    folds = False
    may_fail = False

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        graph = model.graph
        types = _types(model)
        narrow = {name for name, t in types.items() if t in NARROW}
        plan = _plan(graph, types, narrow) if narrow else None
        if not plan:
            return onnx_ir.passes.PassResult(model, modified=False)
        counts: Counter[str] = Counter()
        for node, (how, source, target) in plan.items():
            nodes = Nodes()
            if how == "decode":
                out = _decode(nodes, node.inputs[0], source, target)  # type: ignore[arg-type]
            else:
                saturate = bool(_attr(node, "saturate", 1))
                round_mode = str(_attr(node, "round_mode", "up"))
                out = _encode(nodes, node.inputs[0], source, target, saturate, round_mode)  # type: ignore[arg-type]
            ir.convenience.replace_nodes_and_values(graph, node, [node], nodes.nodes, [node.outputs[0]], [out])
            counts[f"{how}_{T.DataType.Name(target if how == 'encode' else source).lower()}"] += 1
        values = [*graph.inputs, *graph.initializers.values(), *(v for n in graph for v in n.outputs)]
        for value in values:  # they hold bytes now (an encode's output took the narrow type of the cast it replaced)
            if value.name in narrow:
                value.dtype = ir.DataType.UINT8
                if value.const_value is not None:
                    raw = np.ascontiguousarray(value.const_value.numpy()).view(np.uint8)
                    value.const_value = ir.tensor(raw, name=value.const_value.name)
        self.stats = dict(counts)
        return onnx_ir.passes.PassResult(model, modified=True)


def _plan(graph: ir.Graph, types: dict[str, int], narrow: set[str]) -> dict[ir.Node, tuple[str, int, int]] | None:
    """Each cast touching a narrow value: how it is rewritten, from and to which type; None where any other op
    touches one, or one is made by anything but a graph input, an initializer or a cast to it."""
    produced_by_cast: set[str] = set()
    plan = {}
    for node in graph:
        touches = [v.name for v in [*node.inputs, *node.outputs] if v is not None and v.name in narrow]
        if not touches:
            continue
        if node.domain not in ("", "ai.onnx") or node.op_type not in ("Cast", "CastLike"):
            return None
        source = types.get(str(node.inputs[0].name)) if node.inputs[0] is not None else None
        if node.op_type == "Cast":
            to = node.attributes.get("to")
            target = to.value if to is not None else None
        else:
            target = types.get(str(node.inputs[1].name)) if node.inputs[1] is not None else None
        if source is None or target is None:
            return None
        if source in NARROW and target not in NARROW and target in _DECODE_TO:
            plan[node] = ("decode", source, int(target))
        elif target in _FLOAT8 and source in _ENCODABLE:
            plan[node] = ("encode", source, int(target))
            produced_by_cast.add(str(node.outputs[0].name))
        else:
            return None
    inputs = {v.name for v in graph.inputs} | set(graph.initializers)
    if any(n not in inputs and n not in produced_by_cast for n in narrow):
        return None  # produced by something else (a subgraph, an op not listed): left to the coverage check
    return plan


def storage_dtype(dtype: str) -> str:
    """The numpy dtype a narrow ``ml_dtypes`` dtype name crosses the tvm runtime as (others unchanged)."""
    import ml_dtypes

    kind = getattr(ml_dtypes, dtype, None)
    return "uint8" if kind is not None and np.dtype(kind).itemsize == 1 else dtype


def _decode(nodes: Nodes, x: ir.Value, source: int, target: int) -> ir.Value:
    with np.errstate(all="ignore"):
        table = np.arange(256, dtype=np.uint8).view(numpy_dtype(source)).astype(numpy_dtype(target))
    return nodes.op("Gather", [nodes.constant(table), nodes.op("Cast", [x], {"to": T.INT64})], {"axis": 0})


def _encode(nodes: Nodes, x: ir.Value, source: int, target: int, saturate: bool, round_mode: str) -> ir.Value:
    bounds, codes, nan_code, zero_codes = encoding(target, saturate, round_mode)
    if source != T.FLOAT:
        x = nodes.op("Cast", [x], {"to": T.FLOAT})
    # bounds[i] is the least float32 whose byte is codes[i + 1]: find i = how many bounds are <= x.
    # below[j] = bounds[j - 1] (below[0] = -inf), so the search looks up below[candidate].
    below = np.concatenate([[-np.inf], bounds]).astype(np.float32)
    below_value, codes_value = nodes.constant(below), nodes.constant(codes)
    step = len(codes) // 2
    hit = nodes.op("GreaterOrEqual", [x, nodes.constant(np.array(below[step], np.float32))])
    index = nodes.op("Where", [hit, nodes.constant(np.array(step, np.int64)), nodes.constant(np.array(0, np.int64))])
    step //= 2
    while step:
        candidate = nodes.op("Add", [index, nodes.constant(np.array(step, np.int64))])
        bound = nodes.op("Gather", [below_value, candidate], {"axis": 0})
        index = nodes.op("Where", [nodes.op("GreaterOrEqual", [x, bound]), candidate, index])
        step //= 2
    code = nodes.op("Gather", [codes_value, index], {"axis": 0})
    negative_zero, positive_zero = zero_codes
    if negative_zero != positive_zero:  # compares cannot tell -0 from +0: 1 / -0 = -inf can
        zero_f, one_f = nodes.constant(np.array(0, np.float32)), nodes.constant(np.array(1, np.float32))
        is_zero = nodes.op("Equal", [x, zero_f])
        negative = nodes.op("Less", [nodes.op("Div", [one_f, x]), zero_f])
        minus_zero = nodes.op("And", [is_zero, negative])
        code = nodes.op("Where", [minus_zero, nodes.constant(np.array(negative_zero, np.uint8)), code])
    is_nan = nodes.op("IsNaN", [x])
    return nodes.op("Where", [is_nan, nodes.constant(np.array(nan_code, np.uint8)), code])


def _attr(node: ir.Node, name: str, default: Any = None) -> Any:
    found = node.attributes.get(name)
    return default if found is None else found.value


def _types(model: ir.Model) -> dict[str, int]:
    """Element types of the main graph's values (inferred, on a copy, where the graph does not declare them)."""
    copy = copy_of(model)
    infer_types(copy)
    types = {}
    for value in [*copy.graph.inputs, *copy.graph.initializers.values(), *copy.graph.outputs]:
        if value.name and value.dtype is not None:
            types[value.name] = int(value.dtype)
    for node in copy.graph:
        for value in node.outputs:
            if value.name and value.dtype is not None:
                types.setdefault(value.name, int(value.dtype))
    return types
