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
from onnx import helper, numpy_helper

from aotforge.targets.tvm.importable.base import ImportStep, infer_types
from aotforge.targets.tvm.importable.narrow_encoding import encoding, numpy_dtype
from aotforge.targets.tvm.importable.splice import Names, splice

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
        names = Names(graph)
        counts: Counter[str] = Counter()
        for node, (how, source, target) in plan.items():
            proto = ir.serde.serialize_node(node)
            if how == "decode":
                replaced = _decode(proto, source, target, names.taken)
            else:
                saturate = bool(_attr(proto, "saturate", 1))
                round_mode = _attr(proto, "round_mode", b"up").decode()
                replaced = _encode(proto, source, target, saturate, round_mode, names.taken)
            splice(graph, node, replaced, names)
            counts[f"{how}_{T.DataType.Name(target if how == 'encode' else source).lower()}"] += 1
        for name in narrow:  # the values (their types copied from the casts they replaced) hold bytes now
            value = names.values[name]
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


def _decode(node: onnx.NodeProto, source: int, target: int, names: set[str]) -> list[onnx.NodeProto]:
    with np.errstate(all="ignore"):
        table = np.arange(256, dtype=np.uint8).view(numpy_dtype(source)).astype(numpy_dtype(target))
    out = node.output[0]
    table_name, index = _fresh(names, out + "_decode_table"), _fresh(names, out + "_bits")
    return [
        _constant(table_name, table),
        helper.make_node("Cast", [node.input[0]], [index], to=T.INT64),
        helper.make_node("Gather", [table_name, index], [out], axis=0, name=node.name),
    ]


def _encode(
    node: onnx.NodeProto, source: int, target: int, saturate: bool, round_mode: str, names: set[str]
) -> list[onnx.NodeProto]:
    bounds, codes, nan_code, zero_codes = encoding(target, saturate, round_mode)
    out = node.output[0]

    def fresh(suffix: str) -> str:
        return _fresh(names, f"{out}_{suffix}")

    nodes: list[onnx.NodeProto] = []
    x = node.input[0]
    if source != T.FLOAT:
        x32 = fresh("f32")
        nodes.append(helper.make_node("Cast", [x], [x32], to=T.FLOAT))
        x = x32
    # bounds[i] is the least float32 whose byte is codes[i + 1]: find i = how many bounds are <= x.
    # below[j] = bounds[j - 1] (below[0] = -inf), so the search looks up below[candidate].
    below = np.concatenate([[-np.inf], bounds]).astype(np.float32)
    below_name, codes_name = fresh("bounds"), fresh("codes")
    nodes += [_constant(below_name, below), _constant(codes_name, codes)]
    step = len(codes) // 2
    first_bound, hit, zero, index = fresh("first_bound"), fresh("ge"), fresh("zero"), fresh("index")
    first = fresh("step")
    nodes += [
        _constant(first_bound, np.array(below[step], np.float32)),
        _constant(first, np.array(step, np.int64)),
        _constant(zero, np.array(0, np.int64)),
        helper.make_node("GreaterOrEqual", [x, first_bound], [hit]),
        helper.make_node("Where", [hit, first, zero], [index]),
    ]
    step //= 2
    while step:
        size, candidate, bound, ge, chosen = (fresh(s) for s in ("size", "candidate", "bound", "ge", "index"))
        nodes += [
            _constant(size, np.array(step, np.int64)),
            helper.make_node("Add", [index, size], [candidate]),
            helper.make_node("Gather", [below_name, candidate], [bound], axis=0),
            helper.make_node("GreaterOrEqual", [x, bound], [ge]),
            helper.make_node("Where", [ge, candidate, index], [chosen]),
        ]
        index = chosen
        step //= 2
    code = fresh("code")
    nodes.append(helper.make_node("Gather", [codes_name, index], [code], axis=0))
    negative_zero, positive_zero = zero_codes
    if negative_zero != positive_zero:  # compares cannot tell -0 from +0: 1 / -0 = -inf can
        zero_f, one_f, is_zero, inverse, negative, minus_zero, neg_code, placed = (
            fresh(s) for s in ("zero_f", "one_f", "is_zero", "inverse", "negative", "minus_zero", "neg0", "signed")
        )
        nodes += [
            _constant(zero_f, np.array(0, np.float32)),
            _constant(one_f, np.array(1, np.float32)),
            _constant(neg_code, np.array(negative_zero, np.uint8)),
            helper.make_node("Equal", [x, zero_f], [is_zero]),
            helper.make_node("Div", [one_f, x], [inverse]),
            helper.make_node("Less", [inverse, zero_f], [negative]),
            helper.make_node("And", [is_zero, negative], [minus_zero]),
            helper.make_node("Where", [minus_zero, neg_code, code], [placed]),
        ]
        code = placed
    is_nan, nan_name = fresh("is_nan"), fresh("nan_code")
    nodes += [
        _constant(nan_name, np.array(nan_code, np.uint8)),
        helper.make_node("IsNaN", [x], [is_nan]),
        helper.make_node("Where", [is_nan, nan_name, code], [out], name=node.name),
    ]
    return nodes


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _fresh(names: set[str], base: str) -> str:
    name, k = base, 0
    while name in names:
        k += 1
        name = f"{base}_{k}"
    names.add(name)
    return name


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def _types(model: ir.Model) -> dict[str, int]:
    """Element types of the main graph's values (inferred, on a copy, where the graph does not declare them)."""
    copy = model.clone()
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
