"""Make an ONNX graph importable by TVM's Relax ONNX frontend, before it sees it.

One straight line of ONNX-level steps (:func:`import_steps`), each an onnx-ir pass on the model
(``base.ImportStep``) reporting what it changed; :func:`prepare` runs them and serializes once, at the end:

0. narrow types: float8 / 4-bit / 2-bit values that only meet casts become their bytes (uint8),
   the casts table look-ups matching ONNX's reference (``narrow.py``);
1. bind: every input dim to the bucket's size, then fold (onnxscript's optimizer: Shape, Size,
   Range, ConstantOfShape and shape arithmetic become constants; ``axes`` / ``pads`` computed in
   the graph too), since the importer takes many of them only as constants (``bind.py``);
2. expand: ops the importer lacks (or gets wrong) that ONNX defines as functions become their
   bodies, inlined by onnx-ir's InlinePass (``expand.py``);
3. unroll: Scans with static lengths and Loops with constant trip counts (some function bodies are
   Scans or Loops) become straight-line graphs
   (``unroll.py``), then fold again, since bodies compute shapes from shapes;
4. legalize: rewrites of ops the importer lacks or computes wrongly into ops it imports right, one
   onnxscript rewrite rule per module in ``rules/`` (``legalize.py``: none of their ops has a
   function body), then fold;
5. constants: folded Constant nodes written as ``value=`` tensors, the only form the importer reads
   (``constants.py``).

Each fold runs on the IR; a step that breaks leaves the graph as it was before it, and the report
says why under ``<step>_failed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.base import ImportStep, copy_of, fold
from aotforge.targets.tvm.importable.bind import BindShapesPass
from aotforge.targets.tvm.importable.constants import ConstantsAsTensorsPass
from aotforge.targets.tvm.importable.expand import ExpandFunctionsPass
from aotforge.targets.tvm.importable.legalize import LegalizePass
from aotforge.targets.tvm.importable.narrow import NarrowTypesPass
from aotforge.targets.tvm.importable.support import wants_expansion
from aotforge.targets.tvm.importable.unroll import UnrollLoopsPass


def import_steps(shapes: Mapping[str, list[Any]]) -> list[ImportStep]:
    """The steps, in the order they run (see the module's docstring)."""
    return [
        NarrowTypesPass(),  # before the first fold (bind's): onnxscript's CastLike rule drops saturate=0
        BindShapesPass(shapes),
        ExpandFunctionsPass(wants_expansion),
        UnrollLoopsPass(),  # after expand: some function bodies are Scans or Loops
        LegalizePass(),
        ConstantsAsTensorsPass(),  # last: the folds write Constant nodes in other forms
    ]


def prepare(model: ir.Model, shapes: Mapping[str, list[Any]]) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """A copy of the IR with ``shapes`` bound, folded, legalized and expanded, as a proto; what each step did."""
    model = copy_of(model)
    report: dict[str, Any] = {}
    for step in import_steps(shapes):
        before = copy_of(model) if step.may_fail else None
        try:
            result = step(model)
            if result.modified and step.folds:
                fold(result.model)
        except Exception as e:  # the importer has the last word on what that step would have rewritten
            if before is None:
                raise
            from aotforge.core.errors import describe

            report[f"{step.name}_failed"] = describe(e, last=True)
            model = before
            continue
        model = result.model
        report[step.name] = step.report()
    return ir.serde.serialize_model(model), {k: v for k, v in report.items() if v}
