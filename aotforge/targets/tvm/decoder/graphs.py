"""The generative ONNX graphs as tvm imports them: the weights as function inputs, the shapes bound.

Both graphs point their large initializers at offsets of one ``weights.data`` (``compiler.generative
.export``). Here every floating-point one becomes a graph *input* named by its offset (``w<offset>``):
the Relax functions take the weights as arguments, so ``lib.so`` holds code only, and the runtime
reads ``weights.data`` once and hands the same tensors to the prefill and the decode functions. Each
function's weights are listed in the order it takes them (``Prepared.weights``). Integer tables the
exporter stored outside (a position range) go back inline: shape arithmetic must stay constant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir

from aotforge.core.decoder import WEIGHTS_FILE
from aotforge.targets.tvm.importable.base import copy_of
from aotforge.targets.tvm.importable.bind import bind_and_fold

_FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}


@dataclasses.dataclass(frozen=True)
class WeightRef:
    """One weight tensor: the argument name the functions give it, and where it lies."""

    name: str
    offset: int
    length: int
    dtype: str
    shape: tuple[int, ...]
    #: the file holding it: the export's ``weights.data`` (what the graphs point at, and what artifacts built
    #: before ``weight_file.TVM_WEIGHTS_FILE`` store and name by leaving ``file`` out), or the build's own
    file: str = WEIGHTS_FILE

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WeightRef:
        return cls(
            str(data["name"]),
            int(data["offset"]),
            int(data["length"]),
            str(data["dtype"]),
            tuple(data["shape"]),
            str(data.get("file", WEIGHTS_FILE)),
        )


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A graph with its weights as trailing inputs (``weights``, in order) and its runtime inputs first."""

    model: ir.Model
    inputs: tuple[str, ...]
    weights: tuple[WeightRef, ...]


def weights_as_inputs(path: Path) -> Prepared:
    """The graph at ``path`` with its external float initializers turned into inputs ``w<offset>``."""
    model = ir.load(str(path))  # external tensors stay on disk until read
    graph = model.graph
    inputs = tuple(str(v.name) for v in graph.inputs)
    weights: dict[str, WeightRef] = {}
    arguments: dict[str, ir.Value] = {}
    for name, value in list(graph.initializers.items()):
        tensor = value.const_value
        if not isinstance(tensor, ir.ExternalTensor):
            continue
        if tensor.dtype not in _FLOATS:
            value.const_value = ir.tensor(tensor.numpy(), name=name)
            continue
        if value.is_graph_output():  # a weight returned as it is: keep it a value of the graph
            raise ValueError(f"graph output {name} is a weight")
        arg = f"w{tensor.offset or 0}"
        if arg not in arguments:
            shape = tuple(int(d) for d in tensor.shape.numpy())
            weights[arg] = WeightRef(
                arg, tensor.offset or 0, int(tensor.length or tensor.nbytes), tensor.dtype.numpy().name, shape
            )
            arguments[arg] = ir.Value(name=arg, type=ir.TensorType(tensor.dtype), shape=ir.Shape(shape))
        graph.initializers.pop(name)
        ir.convenience.replace_all_uses_with(value, arguments[arg])
    graph.inputs.extend(arguments.values())
    return Prepared(model, inputs, tuple(weights.values()))


def bind_shapes(prepared: Prepared, sizes: Mapping[str, int]) -> Any:
    """The graph with every named input dim set from ``sizes`` and the shape arithmetic folded away.

    The Relax ONNX importer mishandles ``Shape -> Gather -> Reshape`` chains; with static inputs
    onnxscript's optimizer turns them into constants: the bind step of the import steps
    (``importable/bind.py``), as the plain tvm target runs it, on a copy of the graph.
    """
    model = copy_of(prepared.model)
    shapes = {
        str(v.name): [sizes[str(d.value)] if isinstance(d, ir.SymbolicDim) else d for d in v.shape]
        for v in model.graph.inputs
        if v.shape is not None
    }
    return bind_and_fold(model, shapes)


def input_shapes(proto: Any) -> dict[str, list[int]]:
    """Every graph input's (static) shape, as the Relax importer's ``shape_dict`` wants it."""
    return {i.name: [int(d.dim_value) for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}


def input_dtypes(proto: Any) -> dict[str, str]:
    return {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name for i in proto.graph.input}
