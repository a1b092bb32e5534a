"""Pre-flight: which nodes tvm imports as they are, which the import steps rewrite, and which it cannot take.

It runs the ONNX-level steps (``prepare``: seconds, no TVM compile) and then reads what is left
against the importer's converter table, so a model tvm cannot take is refused at planning with
every such node named (op, domain, opset, node, why), not by the first importer error minutes in.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from typing import Any

import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.legalize import PARTLY
from aotforge.targets.tvm.importable.support import importer_ops


@dataclasses.dataclass(frozen=True)
class Refused:
    op: str
    domain: str
    opset: int
    node: str
    reason: str

    def __str__(self) -> str:
        if self.op.startswith("("):  # a value of a type tvm cannot take
            return f"value {self.node!r} {self.op}: {self.reason}"
        return f"{self.domain or 'ai.onnx'}::{self.op}-{self.opset} (node {self.node!r}): {self.reason}"


@dataclasses.dataclass(frozen=True)
class Coverage:
    #: Ops of the source graph the importer takes as they are, with counts.
    direct: dict[str, int]
    #: What the import steps did (expanded / unrolled / legalized / constants_as_tensors).
    rewritten: dict[str, Any]
    refused: list[Refused]

    def to_info(self) -> dict[str, Any]:
        return {"direct": self.direct, "rewritten": self.rewritten, "refused": [str(r) for r in self.refused]}


def check(model: ir.Model, shapes: Mapping[str, list[Any]]) -> Coverage:
    """The coverage of ``model`` with its inputs bound to ``shapes`` (names keep a dim symbolic)."""
    from aotforge.targets.tvm.importable import prepare

    proto, steps = prepare(model, shapes)
    return of_prepared(model, proto, steps)


def of_prepared(model: ir.Model, proto: onnx.ModelProto, steps: Mapping[str, Any]) -> Coverage:
    """The coverage of ``model`` from what :func:`prepare` made of it."""
    ops = importer_ops()
    left = Counter(n.op_type for n in proto.graph.node)
    source = Counter(n.op_type for n in model.graph)
    direct = {op: k for op, k in sorted(source.items()) if left.get(op) and op in ops}
    return Coverage(direct, dict(steps), _refused(proto, ops))


def _refused(proto: onnx.ModelProto, ops: frozenset[str]) -> list[Refused]:
    opsets = {o.domain: o.version for o in proto.opset_import}
    refused = []
    for k, node in enumerate(proto.graph.node):
        opset = opsets.get(node.domain, opsets.get("", 0))
        name = node.name or f"#{k}"
        if node.op_type not in ops:
            why = "not in TVM's ONNX importer, and no function body or rewrite of aotforge's applies"
            if node.op_type in PARTLY:
                why = f"not in TVM's ONNX importer; aotforge's rewrite: {PARTLY[node.op_type]}"
            if node.op_type in ("Scan", "Loop"):
                why = (
                    "a loop whose trip count is not static (aotforge unrolls Scans of static length and Loops of a"
                    " constant trip count whose condition stays true)"
                )
            refused.append(Refused(node.op_type, node.domain, opset, name, why))
    for value in _values(proto):
        wrong = _WRONG_TYPES.get(value.type.tensor_type.elem_type)
        if wrong is not None:
            type_name = onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type)
            refused.append(Refused(f"({type_name} tensor)", "", opsets.get("", 0), value.name, wrong))
    return refused


_FLOAT8 = "TVM 0.27 converts float8 wrongly (infinities, NaN, saturation and -0 come out unlike ONNX's)"
_PACKED = "TVM's runtime holds sub-byte integers packed, numpy one per byte: aotforge cannot pass them"
#: Element types tvm computes wrongly or cannot be fed, and why.
_WRONG_TYPES = {
    onnx.TensorProto.STRING: "TVM has no string tensors",
    onnx.TensorProto.FLOAT8E4M3FN: _FLOAT8,
    onnx.TensorProto.FLOAT8E4M3FNUZ: _FLOAT8,
    onnx.TensorProto.FLOAT8E5M2: _FLOAT8,
    onnx.TensorProto.FLOAT8E5M2FNUZ: _FLOAT8,
    onnx.TensorProto.INT4: _PACKED,
    onnx.TensorProto.UINT4: _PACKED,
    onnx.TensorProto.FLOAT4E2M1: _PACKED,
    **{getattr(onnx.TensorProto, t): _PACKED for t in ("INT2", "UINT2") if hasattr(onnx.TensorProto, t)},
}


def _values(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Every value of the main graph whose type is known (inputs, outputs, inferred intermediates)."""
    try:
        graph = onnx.shape_inference.infer_shapes(proto).graph
    except Exception:  # un-inferable: the declared ones
        graph = proto.graph
    initializers = [onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in graph.initializer]
    seen: dict[str, onnx.ValueInfoProto] = {}
    for value in [*graph.input, *initializers, *graph.value_info, *graph.output]:
        seen.setdefault(value.name, value)
    return list(seen.values())
