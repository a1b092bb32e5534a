"""ONNX Runtime's model runner for the serving runtime: a step engine's sessions (``decoder.OrtStepEngine``) over
a paged KV cache, the blocks kept in step with the contiguous rows the graphs bind (``paged_rows``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.targets.paged_rows import PagedRows, resident_zeros


class OrtModelRunner:
    """The serving runtime's runner (``runtime.runner.ModelRunner``) over a step engine's sessions.

    The pool of blocks is the cache of record; what the graphs bind are contiguous working rows kept in step
    with it (``paged_rows``): ``max_rows`` rows for a decode (views of the first ``rows`` of them, made once per
    row count), and one more for ``extend``. A prompt runs alone through the prefill graph and its keys/values
    are copied into its blocks; ``extend`` (a prompt chunk, or the rest after a cached prefix) runs the verify
    graph over the extra row, which artifacts built with ``--speculative-k`` carry.
    """

    def __init__(
        self, spec: DecoderSpec, prefill_session: Any, decode_session: Any, verify_session: Any, *, max_rows: int
    ) -> None:
        self.spec = spec
        self.prefill_session, self.decode_session, self.verify_session = prefill_session, decode_session, verify_session
        self._past, self._present = spec.kv_names("past"), spec.kv_names("present")
        self.max_rows = max_rows
        self.can_extend = verify_session is not None
        self.paged: PagedRows | None = None
        self._decodes: dict[int, tuple[Any, np.ndarray, np.ndarray, np.ndarray]] = {}

    def allocate(self, num_blocks: int, block_size: int) -> None:
        if self.paged is not None and self.paged.matches(num_blocks, block_size):
            # generate() makes an engine a call over the same runner: clearing the rows and the pool again would
            # cost more than a short call (the first touch of fresh pages), and rows past a length are never read.
            self.paged.reset()
            return
        spec = self.spec
        shape = (len(self._past), self.max_rows + 1, spec.kv_heads, spec.max_seq_len, spec.head_dim)
        self.paged = None  # the old cache goes before the new one is allocated
        self.paged = PagedRows(num_blocks, block_size, resident_zeros(shape))  # each layer's rows a view of one
        self._decodes = {}

    def kv_cache_bytes(self) -> int:
        return self.paged.nbytes() if self.paged is not None else 0

    def _rows(self) -> PagedRows:
        if self.paged is None:
            raise RuntimeError("the runner's KV pool is not allocated: call allocate(num_blocks, block_size) first")
        return self.paged

    def decode_rows(self, rows: int) -> int:
        return rows

    def decode(self, token_ids: np.ndarray, positions: np.ndarray, block_tables: np.ndarray) -> np.ndarray:
        paged = self._rows()
        rows = len(token_ids)
        order = paged.assign(block_tables)  # sequence i runs on working row order[i]
        for i, row in enumerate(order):
            paged.load(row, block_tables[i], int(positions[i]))
        binding, ids, write_pos, logits = self._decodes.get(rows) or self._bind_decode(rows)
        ids[order, 0] = token_ids
        write_pos[order] = positions
        self.decode_session.run_with_iobinding(binding)
        paged.store(order, block_tables, np.asarray(positions, dtype=np.int64))
        return logits[order]

    def _bind_decode(self, rows: int) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        import onnxruntime as ort

        binding = self.decode_session.io_binding()
        ids = np.zeros((rows, 1), dtype=np.int64)
        positions = np.zeros((rows, 1), dtype=np.int64)
        logits = np.empty((rows, self.spec.vocab), dtype=np.float32)
        binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
        for name, array in (("input_ids", ids), ("position_ids", positions), ("write_pos", positions.reshape(rows))):
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        self._bind_rows(binding, slice(0, rows))
        self._decodes[rows] = (binding, ids, positions.reshape(rows), logits)
        return self._decodes[rows]

    def _bind_rows(self, binding: Any, rows: slice) -> None:
        import onnxruntime as ort

        for past, present, buffer in zip(self._past, self._present, self._rows().rows, strict=True):
            value = ort.OrtValue.ortvalue_from_numpy(buffer[rows])
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)

    def prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        n = len(token_ids)
        feeds = {
            "input_ids": token_ids.reshape(1, n).astype(np.int64),
            "attention_mask": np.ones((1, n), dtype=np.int64),
            "position_ids": np.arange(n, dtype=np.int64)[None, :],
        }
        logits, *present = self.prefill_session.run(["logits", *self.spec.kv_names("present")], feeds)
        self._rows().scatter([values[0] for values in present], block_table, 0)
        return np.asarray(logits)[0]

    def extend(self, token_ids: np.ndarray, start: int, block_table: np.ndarray) -> np.ndarray:
        import onnxruntime as ort

        paged, row = self._rows(), self.max_rows
        paged.load(row, block_table, start)
        n = len(token_ids)
        binding = self.verify_session.io_binding()
        positions = np.arange(start, start + n, dtype=np.int64)[None, :]
        logits = np.empty((1, n, self.spec.vocab), dtype=np.float32)
        for name, array in (
            ("input_ids", token_ids.reshape(1, n).astype(np.int64)),
            ("position_ids", positions),
            ("write_pos", positions[:, 0].copy()),
        ):
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
        self._bind_rows(binding, slice(row, row + 1))
        self.verify_session.run_with_iobinding(binding)
        paged.scatter([buffer[row, :, start : start + n] for buffer in paged.rows], block_table, start)
        paged.record(row, block_table, start + n)  # the next chunk of this prompt loads nothing
        return logits[0, -1]
