"""ONNX Runtime step engine: two sessions over the shared weights, the KV cache updated in place.

The cache is one numpy array per layer and kind, wrapped once per call as an ``OrtValue`` (same
memory) and bound through I/O binding as both the decode graph's ``past_*`` input and its
``present_*`` output: GroupQueryAttention (or, in a graph exported with masked attention,
ScatterElements) writes the new token's keys/values into the very buffer it reads, so no
cache-sized tensor is allocated per token.
``cache_pointers`` lets a test check that the buffers never move.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DECODE_FILE, PREFILL_FILE, VERIFY_FILE, DecoderSpec
from aotforge.core.errors import CompileError, describe
from aotforge.core.target_record import TargetRecord
from aotforge.targets.base import CompileResult
from aotforge.targets.generative.runner import GenerativeRunner

SESSION_FILE = "session.json"
#: The decode graph this engine runs (``compiler.generative.export``): ORT's GroupQueryAttention writes each
#: slot's new key/value into the bound cache and attends over the slot's filled length only.
DECODE_ATTENTION = "gqa"
#: This engine runs a verify graph (``--speculative-k``): ``compile_generative(..., verify_width=)``.
SPECULATIVE = True


def rewrite_graphs(graphs: dict[str, Any], spec: DecoderSpec) -> dict[str, dict[str, int]]:
    """ONNX Runtime contrib ops in every graph (``ort_fusions``): RMSNorm, residual + RMSNorm, rotary embeddings.

    Returns each graph's fusion counts (``target.info.fusions``)."""
    from aotforge.targets.generative.ort_fusions import fuse_for_ort

    return {name.removesuffix(".onnx"): fuse_for_ort(graph, spec.max_seq_len) for name, graph in graphs.items()}


def compile_generative(
    workdir: Path, spec: DecoderSpec, options: Any, say: Any, verify_width: int = 0
) -> CompileResult:
    """ORT optimizes each graph when a session opens it; the artifact keeps the session settings.

    Both graphs are opened here once, so an op ORT lacks fails the build, not the serving host."""
    import onnxruntime as ort

    from aotforge.targets.onnxruntime import session_options

    settings = dataclasses.asdict(options)
    (workdir / SESSION_FILE).write_text(json.dumps(settings, sort_keys=True, indent=2) + "\n")
    OrtStepEngine(workdir, spec, session_options(options), list(options.providers), verify_width)
    return CompileResult(
        files=(SESSION_FILE,),
        target_info={"device": "cpu", "options": settings},
        toolchain={"onnxruntime": ort.__version__},
    )


def load_generative(artifact_dir: Path, record: TargetRecord) -> GenerativeRunner:
    from aotforge.targets.onnxruntime import session_options, stored_options

    options = stored_options(artifact_dir, record)
    spec = DecoderSpec.from_dict(record.info["decoder"])
    width = int(record.info.get("speculative", {}).get("verify_width", 0))
    engine = OrtStepEngine(artifact_dir, spec, session_options(options), list(options.providers), width)
    return GenerativeRunner(engine)


class OrtStepEngine:
    def __init__(
        self, artifact_dir: Path, spec: DecoderSpec, session_options: Any, providers: list[str], verify_width: int = 0
    ) -> None:
        import onnxruntime as ort

        self.spec = spec
        self.verify_width = verify_width
        self.verify_session: Any = None
        try:
            self.prefill_session = ort.InferenceSession(str(artifact_dir / PREFILL_FILE), session_options, providers)
            self.decode_session = ort.InferenceSession(str(artifact_dir / DECODE_FILE), session_options, providers)
            if verify_width:
                self.verify_session = ort.InferenceSession(str(artifact_dir / VERIFY_FILE), session_options, providers)
        except Exception as e:
            raise CompileError(f"onnxruntime cannot open the prefill/decode graphs: {describe(e, last=True)}") from e
        self._past, self._present = spec.kv_names("past"), spec.kv_names("present")
        self.cache: list[np.ndarray] = []
        self._binding: Any = None
        self._row_bindings: list[Any] = []
        self._logits = np.empty((0, spec.vocab), dtype=np.float32)
        self._ids = self._positions = self._write_pos = np.zeros(0, dtype=np.int64)

    def start(self, batch: int, prompt_len: int) -> None:
        import onnxruntime as ort

        spec = self.spec
        shape = (batch, spec.kv_heads, spec.max_seq_len, spec.head_dim)
        # Zeroed once per call: positions a slot has not written yet are masked out, never read as garbage.
        self.cache = [np.zeros(shape, dtype=np.float32) for _ in self._past]
        self._logits = np.empty((batch, spec.vocab), dtype=np.float32)
        binding = self.decode_session.io_binding()
        binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(self._logits))
        # The step's inputs too are bound once, over buffers each step writes (a bind per input per token
        # is a few microseconds each: a draft model's step is a few hundred).
        self._ids = np.zeros((batch, 1), dtype=np.int64)
        self._positions = np.zeros((batch, 1), dtype=np.int64)
        self._write_pos = np.zeros(batch, dtype=np.int64)
        for name, array in (
            ("input_ids", self._ids),
            ("position_ids", self._positions),
            ("write_pos", self._write_pos),
        ):
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        for past, present, buffer in zip(self._past, self._present, self.cache, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(buffer)
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        self._binding = binding
        self._row_bindings = []
        if self.verify_session is not None:
            # GroupQueryAttention takes several new tokens against a past only at batch 1: one binding per slot,
            # over that slot's part of the same cache buffers (a view, no copy).
            for row in range(batch):
                row_binding = self.verify_session.io_binding()
                for past, present, buffer in zip(self._past, self._present, self.cache, strict=True):
                    value = ort.OrtValue.ortvalue_from_numpy(buffer[row : row + 1])
                    row_binding.bind_ortvalue_input(past, value)
                    row_binding.bind_ortvalue_output(present, value)
                self._row_bindings.append(row_binding)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        logits, *present = self.prefill_session.run(None, feeds)
        steps = input_ids.shape[1]
        for buffer, values in zip(self.cache, present, strict=True):
            buffer[:, :, :steps] = values  # once per call: the prompt's keys/values into its slots
        return np.asarray(logits)

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        self._ids[:] = np.reshape(input_ids, self._ids.shape)
        self._positions[:, 0] = write_pos
        self._write_pos[:] = write_pos
        self.decode_session.run_with_iobinding(self._binding)
        return self._logits  # written in place by ORT

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        """``[batch, w]`` tokens at ``write_pos ..`` of each slot -> ``logits [batch, w, vocab]``, a call per slot."""
        import onnxruntime as ort

        ids = np.ascontiguousarray(input_ids, dtype=np.int64)
        width = ids.shape[1]
        logits = np.empty((ids.shape[0], width, self.spec.vocab), dtype=np.float32)
        for row in range(ids.shape[0]):
            binding = self._row_bindings[row]
            start = int(write_pos[row])
            binding.bind_cpu_input("input_ids", ids[row : row + 1])
            binding.bind_cpu_input("position_ids", np.arange(start, start + width, dtype=np.int64)[None, :])
            binding.bind_cpu_input("write_pos", np.array([start], dtype=np.int64))
            binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits[row : row + 1]))
            self.verify_session.run_with_iobinding(binding)
        return logits

    def verify_positions(self, width: int) -> int:
        return width

    def cache_pointers(self) -> list[int]:
        """Where ORT last wrote each ``present_*`` output (the cache buffers, if nothing was reallocated)."""
        return [value.data_ptr() for value in self._binding.get_outputs()[1:]]

    def buffer_pointers(self) -> list[int]:
        return [buffer.ctypes.data for buffer in self.cache]
