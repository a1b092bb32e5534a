"""What a step hands the model runner, as ``runner.ModelRunner`` takes them: a sequence's block table, its prompt
chunk, and the decode's rows padded to the runner's bucket (the padding rows write to the scratch block)."""

from __future__ import annotations

import numpy as np

from aotforge.runtime.kv_blocks import SCRATCH_BLOCK, KVBlockManager
from aotforge.runtime.runner import ModelRunner
from aotforge.runtime.scheduler import Plan
from aotforge.runtime.sequence import Sequence

#: a prompt chunk: its token ids, the position of its first, the sequence's block table
Chunk = tuple[np.ndarray, int, np.ndarray]
#: a decode: one token id, position and block table per row
DecodeInputs = tuple[np.ndarray, np.ndarray, np.ndarray]


class StepInputs:
    def __init__(self, runner: ModelRunner, blocks: KVBlockManager, table_width: int) -> None:
        self.runner, self.blocks = runner, blocks
        #: how many blocks a table has: enough for the model's whole context
        self.table_width = table_width

    def table(self, seq: Sequence) -> np.ndarray:
        table = np.full(self.table_width, SCRATCH_BLOCK, dtype=np.int64)
        blocks = self.blocks.tables[seq.request_id]
        table[: len(blocks)] = blocks
        return table

    def chunk(self, seq: Sequence, n: int) -> Chunk:
        """The next ``n`` tokens of ``seq`` whose keys and values the cache does not hold yet."""
        start = seq.num_computed
        return np.asarray(seq.all_ids[start : start + n], dtype=np.int64), start, self.table(seq)

    def chunks(self, plan: Plan) -> list[Chunk]:
        return [self.chunk(seq, n) for seq, n in plan.prefills]

    def decode(self, plan: Plan) -> DecodeInputs:
        rows = self.runner.decode_rows(len(plan.decodes))
        ids = np.zeros(rows, dtype=np.int64)
        positions = np.zeros(rows, dtype=np.int64)
        tables = np.full((rows, self.table_width), SCRATCH_BLOCK, dtype=np.int64)
        for row, seq in enumerate(plan.decodes):
            ids[row], positions[row], tables[row] = seq.all_ids[-1], seq.num_computed, self.table(seq)
        return ids, positions, tables

    def step(self, plan: Plan) -> tuple[list[Chunk], DecodeInputs | None]:
        """A step's prompt chunks and decode, as a pipelined runner's ``step`` takes them."""
        return self.chunks(plan), self.decode(plan) if plan.decodes else None
