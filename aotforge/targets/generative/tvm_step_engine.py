"""Run a tvm text-generation artifact: its prefill, decode and verify functions over one set of weights.

``tvm_weights.data`` is read once into tvm tensors that every function call shares. Each call of
``generate`` allocates the cache once (per layer and kind, ``[slots, kv_heads, max_seq_len, head_dim]`` for
the smallest batch bucket that holds it); prompts run one row at a time through the smallest prompt bucket
that holds them (right-padded, mask 0), their keys / values copied into their slots; every decode step
passes the same cache tensors, which the function updates in place and returns (``cache_pointers`` lets a
test check that they never move).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import CompileError, describe
from aotforge.targets.generative.tvm_graphs import WeightRef
from aotforge.targets.generative.tvm_weight_file import read_weights
from aotforge.targets.huge_pages import HugePageReport

LIBRARY = "lib.so"
#: Which function takes which weights, and the buckets (written by ``tvm_engine.compile_generative``).
INFO_FILE = "tvm_generative.json"


class TvmStepEngine:
    def __init__(self, artifact_dir: Path, spec: DecoderSpec) -> None:
        import tvm
        from tvm import relax

        self._tvm = tvm
        self.spec = spec
        info = json.loads((artifact_dir / INFO_FILE).read_text())
        self.prompt_buckets = tuple(info["prompt_buckets"])
        self.batch_buckets = tuple(info["batch_buckets"])
        self.verify_width = int(info.get("verify_width", 0))
        try:
            vm = relax.VirtualMachine(tvm.runtime.load_module(str(artifact_dir / LIBRARY)), tvm.cpu())
        except Exception as e:
            raise CompileError(f"tvm cannot load {artifact_dir / LIBRARY}: {describe(e, last=True)}") from e
        refs = [WeightRef.from_dict(w) for w in info["weights"].values()]
        #: What the kernel granted of the weights' huge pages (``tvm_weight_file.read_weights``).
        self.huge_pages = HugePageReport()
        weights = read_weights(artifact_dir, refs, bool(info.get("huge_pages", True)), self.huge_pages)
        self.vm = vm  # tools/tvm_decode_profile.py sets its instrument
        self._functions = {name: vm[name] for name in info["functions"]}
        self._weights = {name: [weights[w] for w in names] for name, names in info["functions"].items()}
        self.weights = weights
        self.cache: list[Any] = []
        self._views: list[np.ndarray] = []
        self._written: list[Any] = []
        self._slots = 0

    def start(self, batch: int, prompt_len: int) -> None:
        spec = self.spec
        self._slots = next(b for b in self.batch_buckets if b >= batch)
        shape = (self._slots, spec.kv_heads, spec.max_seq_len, spec.head_dim)
        # Zeroed once per call: positions a slot has not written are masked, never read as garbage.
        self.cache = [self._tvm.runtime.empty(shape, "float32") for _ in range(2 * spec.layers)]
        self._views = [np.from_dlpack(t) for t in self.cache]
        for view in self._views:
            view.fill(0.0)
        self._written = []

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        rows = []
        for row in range(input_ids.shape[0]):
            real = np.flatnonzero(attention_mask[row])
            used = int(real[-1]) + 1 if real.size else 1
            rows.append(
                self._prefill_row(row, input_ids[row, :used], attention_mask[row, :used], position_ids[row, :used])
            )
        return np.stack(rows)

    def _prefill_row(self, row: int, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray) -> np.ndarray:
        size = next(p for p in self.prompt_buckets if p >= ids.shape[0])
        used = ids.shape[0]
        padded = [np.zeros((1, size), dtype=np.int64) for _ in range(3)]
        for buffer, values in zip(padded, (ids, mask, positions), strict=True):
            buffer[0, :used] = values
        name = f"prefill_{size}"
        logits, *present = self._functions[name](*map(self._tvm.runtime.tensor, padded), *self._weights[name])
        for view, values in zip(self._views, present, strict=True):
            view[row, :, :used] = np.from_dlpack(values)[0, :, :used]
        return logits.numpy()[0]

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        batch = input_ids.shape[0]
        ids = np.zeros((self._slots, 1), dtype=np.int64)
        pos = np.zeros(self._slots, dtype=np.int64)
        ids[:batch], pos[:batch] = input_ids.reshape(batch, 1), write_pos
        name = f"decode_{self._slots}"
        tensor = self._tvm.runtime.tensor
        logits, *self._written = self._functions[name](
            tensor(ids), tensor(pos[:, None].copy()), tensor(pos), *self.cache, *self._weights[name]
        )
        return logits.numpy()[:batch]

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        """``[batch, w]`` tokens at ``write_pos ..`` -> ``logits [batch, w, vocab]``: the function takes
        ``verify_width`` tokens, so a shorter call is padded (its padding writes positions nobody reads
        before they are written again; ``verify_positions``)."""
        batch, width = input_ids.shape
        ids = np.zeros((self._slots, self.verify_width), dtype=np.int64)
        pos = np.zeros(self._slots, dtype=np.int64)
        ids[:batch, :width], pos[:batch] = input_ids, write_pos
        positions = pos[:, None] + np.arange(self.verify_width, dtype=np.int64)[None, :]
        name = f"verify_{self._slots}"
        tensor = self._tvm.runtime.tensor
        logits, *self._written = self._functions[name](
            tensor(ids), tensor(positions), tensor(pos), *self.cache, *self._weights[name]
        )
        return logits.numpy()[:batch, :width]

    def verify_positions(self, width: int) -> int:
        return self.verify_width

    def cache_pointers(self) -> list[int]:
        """Where the last decode step's ``present_*`` outputs live (the cache, if it was updated in place)."""
        return [t.data_ptr() for t in self._written]

    def buffer_pointers(self) -> list[int]:
        return [t.data_ptr() for t in self.cache]
