"""tensorrt text generation at run time: the prefill and decode engines as one generative step engine.

Needs TensorRT and a GPU, like :class:`targets.tensorrt.runner.TrtRunner`, whose dtype helpers it uses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aotforge.core.errors import ArtifactError, InputSpecError
from aotforge.targets.tensorrt.runner import to_numpy, to_torch, torch_dtype


class TrtStepEngine:
    """The prefill and decode engines as a generative step engine (``targets.generative.decoding.StepEngine``).

    Both engines run on one CUDA stream, by tensor name (TensorRT 10's I/O API, as :class:`TrtRunner`:
    ``IExecutionContext.set_input_shape`` / ``set_tensor_address`` / ``execute_async_v3``). ``start``
    allocates the call's device buffers once at their full size: two KV caches per layer and kind (the
    decode graph reads ``past`` from one and writes ``present`` into the other, then they swap), the
    logits, and the token inputs; ``prefill`` copies the prompt's keys/values into the first positions
    of the current cache on the device. Only token ids and logits cross to the host.
    """

    def __init__(
        self,
        prefill_bytes: bytes,
        decode_bytes: bytes,
        spec: Any,
        *,
        logger: Any,
        allow_host_code: bool,
        communicator: Any = None,
    ) -> None:
        import tensorrt as trt
        import torch

        runtime = trt.Runtime(logger)
        runtime.engine_host_code_allowed = allow_host_code  # verified artifact (see TrtRunner)
        self.spec = spec
        self.engines, self.contexts, self.dtypes = {}, {}, {}
        for kind, blob in (("prefill", prefill_bytes), ("decode", decode_bytes)):
            engine = runtime.deserialize_cuda_engine(blob)
            if engine is None:
                raise ArtifactError(f"tensorrt could not deserialize the {kind} engine (see its log): rebuild it")
            self.engines[kind] = engine
            self.contexts[kind] = engine.create_execution_context()
            # A rank's engines reduce over NCCL: each context is told the communicator before it runs (TensorRT's
            # multi-device guide: IExecutionContext.set_communicator).
            if communicator is not None and not self.contexts[kind].set_communicator(communicator):
                raise ArtifactError(f"tensorrt refused the NCCL communicator for the {kind} engine (see its log)")
            names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
            self.dtypes[kind] = {n: torch_dtype(engine.get_tensor_dtype(n).name) for n in names}
        self.stream = torch.cuda.Stream()
        self._past, self._present = spec.kv_names("past"), spec.kv_names("present")
        self.caches: tuple[list[Any], list[Any]] = ([], [])
        self._current = 0  # which of the two caches holds the sequence so far
        self._logits: Any = None
        self._steps: dict[str, Any] = {}
        self._batch = 0

    def start(self, batch: int, prompt_len: int) -> None:
        import torch

        spec = self.spec
        shape = (batch, spec.kv_heads, spec.max_seq_len, spec.head_dim)
        # Zeroed once per call: positions a slot has not written yet are masked, never read as garbage.
        self.caches = tuple(
            [torch.zeros(shape, dtype=torch.float32, device="cuda") for _ in self._past] for _ in range(2)
        )  # type: ignore[assignment]
        self._current, self._batch = 0, batch
        self._logits = torch.empty((batch, spec.vocab), dtype=torch.float32, device="cuda")
        context, dtypes = self.contexts["decode"], self.dtypes["decode"]
        # The decode engine's token inputs, bound once: each step copies into them.
        self._steps = {
            "input_ids": torch.empty((batch, 1), dtype=dtypes["input_ids"], device="cuda"),
            "position_ids": torch.empty((batch, 1), dtype=dtypes["position_ids"], device="cuda"),
            "write_pos": torch.empty((batch,), dtype=dtypes["write_pos"], device="cuda"),
        }
        for name, tensor in self._steps.items():
            self._set_shape(context, name, tuple(tensor.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        for name in self._past:
            self._set_shape(context, name, shape)
        context.set_tensor_address("logits", self._logits.data_ptr())

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        import torch

        context, dtypes = self.contexts["prefill"], self.dtypes["prefill"]
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        keep = []  # device tensors must outlive the enqueue
        with torch.cuda.stream(self.stream):
            for name, array in feeds.items():
                tensor = to_torch(np.ascontiguousarray(array), dtypes[name]).to("cuda", non_blocking=False)
                self._set_shape(context, name, tuple(tensor.shape))
                context.set_tensor_address(name, tensor.data_ptr())
                keep.append(tensor)
            logits = torch.empty((input_ids.shape[0], self.spec.vocab), dtype=torch.float32, device="cuda")
            context.set_tensor_address("logits", logits.data_ptr())
            steps = input_ids.shape[1]
            present = []
            for name in self._present:
                out = torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtypes[name], device="cuda")
                context.set_tensor_address(name, out.data_ptr())
                present.append(out)
            if not context.execute_async_v3(self.stream.cuda_stream):
                raise InputSpecError("tensorrt's prefill engine refused the inputs (outside its profile?)")
            for cache, values in zip(self.caches[self._current], present, strict=True):
                cache[:, :, :steps].copy_(values)  # once per call: the prompt's keys/values into its slots
            result = to_numpy(logits.cpu())
        self.stream.synchronize()
        return result

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        import torch

        context, dtypes = self.contexts["decode"], self.dtypes["decode"]
        positions = np.ascontiguousarray(write_pos, dtype=np.int64)
        feeds = {"input_ids": input_ids, "position_ids": positions[:, None], "write_pos": positions}
        read, write = self.caches[self._current], self.caches[1 - self._current]
        with torch.cuda.stream(self.stream):
            for name, array in feeds.items():
                self._steps[name].copy_(to_torch(np.ascontiguousarray(array), dtypes[name]))
            for past, present, src, dst in zip(self._past, self._present, read, write, strict=True):
                context.set_tensor_address(past, src.data_ptr())
                context.set_tensor_address(present, dst.data_ptr())
            if not context.execute_async_v3(self.stream.cuda_stream):
                raise InputSpecError("tensorrt's decode engine refused the inputs (outside its profile?)")
            result = to_numpy(self._logits.cpu())
        self.stream.synchronize()
        self._current = 1 - self._current
        return result

    def cache_pointers(self) -> list[int]:
        """Device addresses of both caches: a test checks they never change within a call."""
        return [t.data_ptr() for half in self.caches for t in half]

    @staticmethod
    def _set_shape(context: Any, name: str, shape: tuple[int, ...]) -> None:
        if not context.set_input_shape(name, shape):
            raise InputSpecError(f"tensorrt input {name!r} shape {shape} is outside the engine's profile")
