"""What a target gives the serving runtime: a model runner over a paged KV cache.

The runner only executes the step it is given (vLLM's split: the scheduler decides, the KV manager hands out
blocks, the runner runs). Its cache is a pool of ``num_blocks`` blocks of ``block_size`` positions per layer
and kind (keys, values), shared by every sequence; each call names the tokens, their positions and each
sequence's **block table** (int64 block ids, position ``t`` in block ``table[t // block_size]`` at
``t % block_size``; entries past what the sequence holds are 0). Block 0 is scratch: the rows that only pad a
step (a target's batch bucket) have all-0 tables and write there, and no sequence's table names it. Blocks
named by several tables (a shared prefix) are only read.

A runner whose stages can each work on a different step (:class:`PipelinedRunner`, ``targets/generative/stages.py``)
also has ``step(chunks, decode) -> (chunk_logits, decode_logits)``: a step's prompt chunks ``[(token_ids, start,
block_table), ...]`` (``prefill`` where ``start`` is 0, else ``extend``) and then its decode ``(token_ids, positions,
block_tables)`` or ``None``, as one call, so a prompt runs as one more micro-batch of the decode's; ``submit(chunks,
decode)``, which sends a step as ``step`` takes it and returns at once; ``collect()``, which waits for the oldest
submitted step's ``(chunk_logits, decode_logits)``; and ``batches_in_flight``, how many steps it can hold at once
(its stages). The engine then keeps that many batches of disjoint sequences in flight (vLLM's virtual engines,
``batch_queue.py``): stage 0 runs the next batch while stage 1 runs this one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from aotforge.core.decoder import DecoderSpec


class ModelRunner(Protocol):
    spec: DecoderSpec
    #: sequences one decode can take (the artifact's batch)
    max_rows: int
    #: True when ``extend`` runs (a prompt in chunks, or after a cached prefix); else every prompt is one ``prefill``
    can_extend: bool

    def allocate(self, num_blocks: int, block_size: int) -> None:
        """Make the pool: ``num_blocks`` blocks (block 0, the scratch, included) of ``block_size`` positions."""
        ...

    def kv_cache_bytes(self) -> int:
        """The memory the runner's KV cache holds (the pool and any working buffers)."""
        ...

    def prefill(self, token_ids: np.ndarray, block_table: np.ndarray) -> np.ndarray:
        """The whole prompt ``[n]`` at positions ``0 .. n-1`` into ``block_table``'s blocks; its last logits."""
        ...

    def extend(self, token_ids: np.ndarray, start: int, block_table: np.ndarray) -> np.ndarray:
        """``[n]`` tokens at positions ``start ..``, attending to positions ``0 .. start-1`` already in
        ``block_table``'s blocks; the last logits."""
        ...

    def decode_rows(self, rows: int) -> int:
        """How many rows a decode of ``rows`` sequences computes (a target's bucket; the engine pads to it)."""
        ...

    def decode(self, token_ids: np.ndarray, positions: np.ndarray, block_tables: np.ndarray) -> np.ndarray:
        """One token per row ``[b]`` (``b = decode_rows(..)``) written at ``positions [b]`` through ``block_tables
        [b, table_width]`` (``table_width`` blocks cover the model's context); ``[b, vocab]``."""
        ...


@runtime_checkable
class PipelinedRunner(ModelRunner, Protocol):
    #: steps that can be in flight at once: one a stage keeps every stage busy
    batches_in_flight: int

    def step(
        self, chunks: list[tuple[np.ndarray, int, np.ndarray]], decode: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    ) -> tuple[list[np.ndarray], np.ndarray | None]:
        """A step's prompt chunks, then its decode (or None), as one call: each chunk's last logits, the decode's."""
        ...

    def submit(
        self, chunks: list[tuple[np.ndarray, int, np.ndarray]], decode: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    ) -> None:
        """Send a step (as ``step`` takes it) and return before it has run."""
        ...

    def collect(self) -> tuple[list[np.ndarray], np.ndarray | None]:
        """The oldest submitted step's results, as ``step`` returns them, once it has run."""
        ...
