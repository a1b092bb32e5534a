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

import numpy as np
import onnx

from aotforge.core.decoder import WEIGHTS_FILE

_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


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

    proto: Any
    inputs: tuple[str, ...]
    weights: tuple[WeightRef, ...]


def _location(tensor: Any) -> tuple[str, int, int]:
    entries = {e.key: e.value for e in tensor.external_data}
    return entries["location"], int(entries.get("offset", 0)), int(entries["length"])


def weights_as_inputs(path: Path) -> Prepared:
    """The graph at ``path`` with its external float initializers turned into inputs ``w<offset>``."""
    proto = onnx.load(str(path), load_external_data=False)
    graph = proto.graph
    inputs = tuple(i.name for i in graph.input)
    rename: dict[str, str] = {}
    weights: dict[str, WeightRef] = {}
    keep = []
    for tensor in graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            keep.append(tensor)
            continue
        location, offset, length = _location(tensor)
        if tensor.data_type not in _FLOATS:
            keep.append(_inline(tensor, path.parent / location, offset, length))
            continue
        name = f"w{offset}"
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).name
        weights.setdefault(name, WeightRef(name, offset, length, dtype, tuple(int(d) for d in tensor.dims)))
        rename[tensor.name] = name
    del graph.initializer[:]
    graph.initializer.extend(keep)
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in rename:
                node.input[k] = rename[name]
    for output in graph.output:
        if output.name in rename:  # a weight returned as it is: keep it a value of the graph
            raise ValueError(f"graph output {output.name} is a weight")
    for ref in weights.values():
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(ref.dtype))
        graph.input.append(onnx.helper.make_tensor_value_info(ref.name, elem, list(ref.shape)))
    return Prepared(proto, inputs, tuple(weights.values()))


def _inline(tensor: Any, file: Path, offset: int, length: int) -> Any:
    with file.open("rb") as f:
        f.seek(offset)
        raw = f.read(length)
    out = onnx.TensorProto()
    out.CopyFrom(tensor)
    del out.external_data[:]
    out.data_location = onnx.TensorProto.DEFAULT
    out.raw_data = raw
    return out


def bind_shapes(prepared: Prepared, sizes: Mapping[str, int]) -> Any:
    """The graph with every named input dim set from ``sizes`` and the shape arithmetic folded away.

    The Relax ONNX importer mishandles ``Shape -> Gather -> Reshape`` chains; with static inputs
    onnxscript's optimizer turns them into constants: the bind step of the import steps
    (``importable/bind.py``), as the plain tvm target runs it.
    """
    import onnx_ir as ir

    from aotforge.targets.tvm.importable.bind import bind_and_fold

    model = ir.serde.deserialize_model(prepared.proto)
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
