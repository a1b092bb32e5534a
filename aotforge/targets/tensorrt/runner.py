"""The TensorRT runner: a deserialized engine on its own CUDA stream, buffers and a CUDA graph per shape.

What trtexec does by default and a naive runner does not: a dedicated stream (enqueueing on the
default stream makes TensorRT warn and synchronize), device buffers allocated once per input
shape and reused, one CUDA graph captured per shape and replayed (trtexec's ``--useCudaGraph``;
off with ``--target-opt cuda_graphs=false``), and the device time of each call from CUDA events
(trtexec's "GPU Compute Time") beside the caller's end-to-end time. The capture follows the
pattern of Torch-TensorRT's Python runtime: one plain ``execute_async_v3`` first (TensorRT does
its deferred shape work there), then ``torch.cuda.graph(g, stream=...)`` around a second one.

Types cross through torch, not ``trt.nptype`` (which has no bfloat16 / float8): ``TORCH_DTYPES``
maps ``trt.DataType`` names; ml_dtypes arrays (bfloat16, float8) cross as same-width integers.
The dtype helpers run anywhere and are tested on CPU; the runner itself needs TensorRT and a GPU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from aotforge.core.errors import ArtifactError, InputSpecError

#: ``trt.DataType`` member name -> torch dtype name (TensorRT's python docs, tensorrt.DataType).
TORCH_DTYPES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "FP8": "float8_e4m3fn",
    "INT8": "int8",
    "UINT8": "uint8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
}
#: torch dtypes numpy has no type for, and the integer of the same width they cross as.
_VIEW_AS = {"bfloat16": "int16", "float8_e4m3fn": "int8"}


def torch_dtype(trt_dtype_name: str) -> Any:
    import torch

    name = TORCH_DTYPES.get(trt_dtype_name)
    if name is None:
        raise ArtifactError(f"tensorrt engine uses I/O type {trt_dtype_name}, which aotforge cannot feed or read")
    return getattr(torch, name)


def to_torch(array: np.ndarray, dtype: Any) -> Any:
    """``array`` as a CPU tensor of ``dtype``; bfloat16 / float8 arrays (ml_dtypes) go through an integer view."""
    import torch

    name = str(dtype).removeprefix("torch.")
    # np.require keeps a 0-d input 0-d (np.ascontiguousarray makes it 1-d).
    if name in _VIEW_AS:
        wanted = np.dtype(_ml_dtype(name))
        if array.dtype != wanted:
            raise InputSpecError(f"tensorrt input needs {name}, got {array.dtype}")
        raw = np.require(array, requirements="C").view(_VIEW_AS[name])
        return torch.from_numpy(raw).view(dtype)
    return torch.from_numpy(np.require(array, dtype=getattr(np, name if name != "bool" else "bool_"), requirements="C"))


def to_numpy(tensor: Any) -> np.ndarray:
    """A CPU tensor as numpy; bfloat16 / float8 come back as ml_dtypes arrays."""
    import torch

    name = str(tensor.dtype).removeprefix("torch.")
    if name in _VIEW_AS:
        raw = tensor.view(getattr(torch, _VIEW_AS[name])).numpy()
        return raw.view(_ml_dtype(name))
    return np.asarray(tensor.numpy())


def _ml_dtype(name: str) -> Any:
    import ml_dtypes

    return {"bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn}[name]


@dataclasses.dataclass
class _ShapeSlot:
    """Everything bound to one set of input shapes: device buffers, and the graph replaying them."""

    inputs: dict[str, Any]
    outputs: dict[str, Any]
    graph: Any = None


class TrtRunner:
    """A deserialized engine and one execution context; named numpy in, named numpy out."""

    def __init__(self, engine_bytes: bytes, *, logger: Any, allow_host_code: bool, cuda_graphs: bool) -> None:
        import tensorrt as trt
        import torch

        runtime = trt.Runtime(logger)
        # Version-compatible engines embed a lean runtime (host code): loaded only from a
        # verified artifact, which the loader checks by hash before calling us.
        runtime.engine_host_code_allowed = allow_host_code
        self.engine = runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise ArtifactError("tensorrt could not deserialize the engine (see its log): rebuild it on this host")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.dtypes = {n: torch_dtype(self.engine.get_tensor_dtype(n).name) for n in names}
        self.stream = torch.cuda.Stream()
        self.cuda_graphs = cuda_graphs
        self.slots: dict[tuple[tuple[int, ...], ...], _ShapeSlot] = {}
        self._bound: tuple[tuple[int, ...], ...] = ()
        self.device_ms = 0.0  # GPU time of the last call (CUDA events), trtexec's "GPU Compute Time"

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        missing = [n for n in self.inputs if n not in inputs]
        if missing:
            raise InputSpecError(f"tensorrt engine needs input {missing[0]!r}; got {', '.join(inputs)}")
        host = {n: to_torch(inputs[n], self.dtypes[n]) for n in self.inputs}
        key = tuple(tuple(host[n].shape) for n in self.inputs)
        slot = self.slots.get(key) or self._bind(key, host)
        self._rebind(key, slot)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            for name, tensor in host.items():
                slot.inputs[name].copy_(tensor)
            start.record(self.stream)
            if slot.graph is not None:
                slot.graph.replay()
            elif not self.context.execute_async_v3(self.stream.cuda_stream):
                raise InputSpecError("tensorrt refused the inputs (shapes outside the engine's profile?)")
            end.record(self.stream)
            result = {name: to_numpy(t.cpu()) for name, t in slot.outputs.items()}
        self.stream.synchronize()
        self.device_ms = float(start.elapsed_time(end))
        return result

    def _bind(self, key: tuple[tuple[int, ...], ...], host: dict[str, Any]) -> _ShapeSlot:
        """Allocate the buffers for one shape set, set the context to them, capture its graph."""
        import torch

        slot = _ShapeSlot(inputs={}, outputs={})
        for name, shape in zip(self.inputs, key, strict=True):
            if not self.context.set_input_shape(name, shape):
                raise InputSpecError(
                    f"tensorrt input {name!r} shape {shape} is outside the engine's profile: rebuild with a wider "
                    "--dynamic range"
                )
            slot.inputs[name] = torch.empty(shape, dtype=self.dtypes[name], device="cuda")
            self.context.set_tensor_address(name, slot.inputs[name].data_ptr())
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise InputSpecError(f"tensorrt output {name!r} has a data-dependent shape {shape}: not supported")
            slot.outputs[name] = torch.empty(shape, dtype=self.dtypes[name], device="cuda")
            self.context.set_tensor_address(name, slot.outputs[name].data_ptr())
        if self.cuda_graphs:
            with torch.cuda.stream(self.stream):
                for name, tensor in host.items():
                    slot.inputs[name].copy_(tensor)
                # One plain enqueue first: TensorRT does deferred work there that must not be captured.
                if not self.context.execute_async_v3(self.stream.cuda_stream):
                    raise InputSpecError("tensorrt refused the inputs (shapes outside the engine's profile?)")
            self.stream.synchronize()
            slot.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(slot.graph, stream=self.stream):
                self.context.execute_async_v3(self.stream.cuda_stream)
        self.slots[key] = slot
        self._bound = key
        return slot

    def _rebind(self, key: tuple[tuple[int, ...], ...], slot: _ShapeSlot) -> None:
        # A captured graph replays its own shapes and buffers; a plain enqueue reads the context's.
        if slot.graph is None and key != self._bound:
            for name, shape in zip(self.inputs, key, strict=True):
                self.context.set_input_shape(name, shape)
                self.context.set_tensor_address(name, slot.inputs[name].data_ptr())
            for name, tensor in slot.outputs.items():
                self.context.set_tensor_address(name, tensor.data_ptr())
            self._bound = key
