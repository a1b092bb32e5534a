"""The node suite's "constants" variant: shape-like inputs bound to their test values, as exported models have them.

onnx's generated cases feed shapes, axes, sizes, counts, quantization parameters and recurrent
weights as graph inputs; exported models have them as constants, and a compiler that folds
shapes (tvm's import steps) sees the difference. ``bind_constant_inputs`` makes those inputs
initializers when every data set gives the same value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

#: Input positions that exported models feed from constants (shapes, axes, sizes, counts, scalar settings,
#: quantization parameters, recurrent weights): op type -> input indices. The "constants" variant binds
#: a graph input found there to its test value (an initializer) when every data set gives the same one.
CONSTANT_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "TopK": (1,),
    "Split": (1,),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    **{
        f"Reduce{r}": (1,)
        for r in ("Sum", "Mean", "Max", "Min", "Prod", "L1", "L2", "LogSum", "LogSumExp", "SumSquare")
    },
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "OneHot": (1, 2),
    "Trilu": (1,),
    "CumSum": (1,),
    "CumProd": (1,),
    "CenterCropPad": (1,),
    "Clip": (1, 2),
    "Col2Im": (1, 2),
    "DFT": (1, 2),
    "STFT": (1, 3),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    "BlackmanWindow": (0,),
    "MelWeightMatrix": (0, 1, 2, 3, 4),
    "NonMaxSuppression": (2, 3, 4),
    "Dropout": (1, 2),
    "AffineGrid": (1,),
    "Loop": (0,),
    "SplitToSequence": (1,),
    "SequenceAt": (1,),
    "SequenceErase": (1,),
    "SequenceInsert": (2,),
    "QuantizeLinear": (1, 2),
    "DequantizeLinear": (1, 2),
    "ConvInteger": (2, 3),
    "MatMulInteger": (2, 3),
    "QLinearMatMul": (1, 2, 4, 5, 6, 7),
    "QLinearConv": (1, 2, 4, 5, 6, 7),
    "LSTM": (1, 2, 3),
    "GRU": (1, 2, 3),
    "RNN": (1, 2, 3),
    "Bernoulli": (),
    "RoiAlign": (),
    "StringSplit": (),
}


def bind_constant_inputs(model: onnx.ModelProto, data_sets: Sequence[Any]) -> tuple[onnx.ModelProto, list[int]]:
    """A copy of ``model`` whose shape-like inputs are initializers; the indices of the inputs still fed.

    An ``*_expanded`` model (a function op's body) binds the inputs its op's model binds, by name.
    """
    graph = model.graph
    names = _constant_input_names(model)
    op = _expanded_op(model)
    if op is not None:
        names |= {name for k in CONSTANT_INPUTS.get(op, ()) if k < len(graph.input) for name in [graph.input[k].name]}
    bound = set()
    for n, value_info in enumerate(graph.input):
        values = [_value(inputs[n]) for inputs, _ in data_sets] if value_info.name in names else []
        if values and isinstance(values[0], np.ndarray) and all(np.array_equal(v, values[0]) for v in values):
            bound.add(n)
    if not bound:
        return model, list(range(len(graph.input)))
    bound_model = onnx.ModelProto()
    bound_model.CopyFrom(model)
    graph = bound_model.graph
    for n in sorted(bound):
        value = data_sets[0][0][n]
        tensor = value if isinstance(value, onnx.TensorProto) else numpy_helper.from_array(np.asarray(value))
        tensor = onnx.TensorProto.FromString(tensor.SerializeToString())
        tensor.name = graph.input[n].name
        graph.initializer.append(tensor)
    kept = [n for n in range(len(graph.input)) if n not in bound]
    inputs = [graph.input[n] for n in kept]
    del graph.input[:]
    graph.input.extend(inputs)
    return bound_model, kept


def _constant_input_names(model: onnx.ModelProto) -> set[str]:
    inputs = {i.name for i in model.graph.input}
    names = set()
    for node in model.graph.node:
        for index in CONSTANT_INPUTS.get(node.op_type, ()) if node.domain in ("", "ai.onnx") else ():
            if index < len(node.input) and node.input[index] in inputs:
                names.add(node.input[index])
    return names


def _expanded_op(model: onnx.ModelProto) -> str | None:
    """The op whose function body an ``*_expanded`` case is (onnx prefixes its values ``<Op>_<case>_expanded_``)."""
    for node in model.graph.node:
        for name in node.output:
            if "_expanded_function_" in name:
                return name.split("_", 1)[0]
    return None


def _value(value: Any) -> Any:
    """A data set's value as an array (numpy scalars too); sequences stay lists, empty optionals None."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return value if isinstance(value, list) or value is None else np.asarray(value)
