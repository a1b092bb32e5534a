"""Make an ONNX graph importable by TVM's Relax ONNX frontend, before it sees it.

One straight line of ONNX-level steps (:func:`prepare`), each reporting what it changed:

0. narrow types: float8 / 4-bit / 2-bit values that only meet casts become their bytes (uint8),
   the casts table look-ups matching ONNX's reference (``narrow.py``);
1. bind: every input dim to the bucket's size, then fold (onnxscript's optimizer: Shape, Size,
   Range, ConstantOfShape and shape arithmetic become constants; ``axes`` / ``pads`` computed in
   the graph too), since the importer takes many of them only as constants;
2. expand: ops the importer lacks (or gets wrong) that ONNX defines as functions become their
   bodies (``expand.py``);
3. unroll: Scans with static lengths and Loops with constant trip counts (some function bodies are
   Scans or Loops) become straight-line graphs
   (``unroll.py``), then fold again, since bodies compute shapes from shapes;
4. legalize: rewrites of ops the importer lacks or computes wrongly into ops it imports right
   (``legalize.py``: none of their ops has a function body), then fold;
5. constants: folded Constant nodes written as ``value=`` tensors (the only form the importer reads).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.expand import expand_functions
from aotforge.targets.tvm.importable.legalize import legalize, tensor_constants
from aotforge.targets.tvm.importable.narrow import narrow_types
from aotforge.targets.tvm.importable.support import wants_expansion
from aotforge.targets.tvm.importable.unroll import unroll_scans


def prepare(model: ir.Model, shapes: Mapping[str, list[Any]]) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """The IR with ``shapes`` bound, folded, legalized and expanded, as a proto; what each step did."""
    source = ir.serde.serialize_model(model)
    # Before the first fold: onnxscript's CastLike rule drops saturate=0, which matters for float8 only.
    narrowed = narrow_types(source)
    static = ir.serde.deserialize_model(source)
    for value in static.graph.inputs:
        if value.name is not None and value.name in shapes:
            value.shape = ir.Shape(shapes[value.name])
    _fold(static)
    proto = ir.serde.serialize_model(static)
    report: dict[str, Any] = {"narrow_types": dict(narrowed)}
    for name, step in (("expanded", _expand), ("unrolled", unroll_scans), ("legalized", legalize)):
        # Each step swaps in its new node list only when it is done, so a step that breaks leaves a whole graph.
        try:
            report[name] = dict(step(proto))
            if report[name]:
                proto = _fold_proto(proto)
        except Exception as e:  # the importer has the last word on what that step would have rewritten
            from aotforge.core.errors import describe

            report[f"{name}_failed"] = describe(e, last=True)
    report["constants_as_tensors"] = tensor_constants(proto)
    return proto, {k: v for k, v in report.items() if v}


def _expand(proto: onnx.ModelProto) -> Any:
    return expand_functions(proto, wants_expansion)


def _fold_proto(proto: onnx.ModelProto) -> onnx.ModelProto:
    model = ir.serde.deserialize_model(proto)
    _fold(model)
    return ir.serde.serialize_model(model)


def _fold(model: ir.Model) -> None:
    from onnxscript.optimizer import optimize_ir

    optimize_ir(model, onnx_shape_inference=True)
