"""Constant nodes in the one form TVM's importer reads: a ``value`` tensor."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes

from aotforge.targets.tvm.importable.base import ImportStep


class ConstantsAsTensorsPass(ImportStep):
    """Constant nodes given as value_int(s) / value_float(s) rewritten with a tensor (the importer reads only that)."""

    name = "constants_as_tensors"
    folds = False
    may_fail = False

    def call(self, model: ir.Model) -> onnx_ir.passes.PassResult:
        count = 0
        for node in model.graph:
            first = next(iter(node.attributes.values()), None)
            if node.op_type != "Constant" or first is None or first.name not in _LISTS:
                continue
            value = np.asarray(first.value, _LISTS[first.name])
            node.attributes.pop(first.name)
            name = node.outputs[0].name
            node.attributes["value"] = ir.AttrTensor("value", ir.tensor(value, name=name))
            count += 1
        self.stats = {"count": count}
        return onnx_ir.passes.PassResult(model, modified=bool(count))

    def report(self) -> Any:
        return self.stats["count"]


_LISTS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}
