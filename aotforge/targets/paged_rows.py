"""The paged KV pool for graphs that read each sequence as one contiguous row, kept in step with the pool.

ONNX Runtime's CPU GroupQueryAttention takes each sequence's keys/values as one contiguous ``[kv_heads,
max_seq_len, head_dim]`` row and has no block table (its PagedAttention is CUDA-only), and so do the slot
functions of tvm artifacts built before their paged ones. So the pool of blocks is the cache of record, and a
decode binds working rows: before a step each row is brought up to its sequence's position
from the blocks of its table, after it the one position the step wrote is copied into its block. A row
remembers which blocks it holds and each block's write count (``epoch``), so a sequence that stays on its
row copies nothing but its new position each step; a row that changes sequence (one ended before it), or
whose blocks were rewritten since, copies what differs.
"""

from __future__ import annotations

import numpy as np


def resident_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """A float32 array of zeros whose memory is written now. ``np.zeros`` maps its pages lazily, so the first
    write to each (huge) page faults and clears it mid-step, which costs far more than the copy that touched it;
    clearing the whole cache once at ``allocate`` moves that cost to the server's start."""
    array = np.empty(shape, dtype=np.float32)
    array.fill(0.0)
    return array


class PagedRows:
    def __init__(self, num_blocks: int, block_size: int, rows: list[np.ndarray] | np.ndarray) -> None:
        """``rows``: what the graph reads and writes, one ``[rows, kv_heads, max_seq_len, head_dim]`` array per
        layer and kind (the caller's: a runtime's own buffers seen through numpy), or all of them stacked in one
        array, which lets a step's store copy every layer's new position in one indexing call."""
        self.block_size = block_size
        self._stacked = rows if isinstance(rows, np.ndarray) else None
        self.rows = list(rows)
        rows_count, kv_heads, _, head_dim = self.rows[0].shape
        #: the cache of record: one ``[num_blocks, kv_heads, block_size, head_dim]`` array per layer and kind
        #: (views of one stacked array when the rows are stacked)
        shape = (num_blocks, kv_heads, block_size, head_dim)
        self._stacked_pool = resident_zeros((len(self.rows), *shape)) if self._stacked is not None else None
        stacked_pool = self._stacked_pool
        self.pool = list(stacked_pool) if stacked_pool is not None else [resident_zeros(shape) for _ in self.rows]
        self.epoch = np.zeros(num_blocks, dtype=np.int64)
        #: per row: the (block, epoch) pairs it holds, in table order, and how many positions of them are valid
        self._held: list[list[tuple[int, int]]] = [[] for _ in range(rows_count)]
        self._length = [0] * rows_count

    def matches(self, num_blocks: int, block_size: int) -> bool:
        """Whether this pool has ``num_blocks`` blocks of ``block_size`` positions."""
        return block_size == self.block_size and num_blocks == len(self.epoch)

    def reset(self) -> None:
        """Every row holds nothing (the memory stays, written: a new engine over the same runner reuses it)."""
        for row in range(len(self._held)):
            self.forget(row)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.pool) + sum(a.nbytes for a in self.rows)

    def forget(self, row: int) -> None:
        self._held[row], self._length[row] = [], 0

    def record(self, row: int, table: np.ndarray, length: int) -> None:
        """``row`` holds positions ``0 .. length-1`` of ``table``'s blocks as the pool has them now."""
        blocks = table[: -(-length // self.block_size)]
        self._held[row] = [(int(b), int(self.epoch[b])) for b in blocks]
        self._length[row] = length

    def _same(self, row: int, table: np.ndarray) -> int:
        """How many of ``table``'s first blocks ``row`` holds as the pool has them."""
        held, same = self._held[row], 0
        while same < len(held) and held[same] == (int(table[same]), int(self.epoch[table[same]])):
            same += 1
        return same

    def assign(self, tables: np.ndarray, first: int = 0) -> np.ndarray:
        """A row of ``first .. first+len(tables)-1`` for each table: the one that holds most of it where one does,
        so a sequence keeps its row when one before it has ended (rather than every later one moving up)."""
        n = len(tables)
        rows = np.full(n, -1, dtype=np.int64)
        free = list(range(first, first + n))
        for i in range(n):
            # Only a row whose first block is the table's can hold any of it: the others are not compared.
            start = int(tables[i][0])
            holders = [r for r in free if self._held[r] and self._held[r][0][0] == start]
            best = max(holders, key=lambda r: self._same(r, tables[i]), default=-1)
            if best >= 0 and self._same(best, tables[i]):
                rows[i] = best
                free.remove(best)
        for unheld in np.flatnonzero(rows < 0):
            rows[unheld] = free.pop(0)
        return rows

    def load(self, row: int, table: np.ndarray, length: int) -> None:
        """Make positions ``0 .. length-1`` of ``row`` those of the blocks of ``table``."""
        bs, held = self.block_size, self._held[row]
        valid = min(self._length[row], self._same(row, table) * bs)
        if valid >= length:
            return
        first, last = valid // bs, -(-length // bs)
        blocks = table[first:last]
        for row_array, pool in zip(self.rows, self.pool, strict=True):
            # [blocks, kv, bs, d] -> the row's [kv, blocks * bs, d], whole blocks (past ``length`` is never read)
            span = row_array[row, :, first * bs : last * bs]
            span.reshape(span.shape[0], len(blocks), bs, -1)[:] = pool[blocks].transpose(1, 0, 2, 3)
        del held[first:]
        held += [(int(b), int(self.epoch[b])) for b in blocks]
        self._length[row] = length

    def store(self, rows: np.ndarray, tables: np.ndarray, positions: np.ndarray) -> None:
        """Each of ``rows`` wrote position ``positions[i]`` (in the block its table names): into the pool."""
        bs = self.block_size
        blocks = tables[np.arange(len(rows)), positions // bs]
        offsets = positions % bs
        if self._stacked is not None and self._stacked_pool is not None:
            self._stacked_pool[:, blocks, :, offsets] = self._stacked[:, rows, :, positions]
        else:
            for row_array, pool in zip(self.rows, self.pool, strict=True):
                pool[blocks, :, offsets] = row_array[rows, :, positions]
        self.epoch[blocks] += 1
        for row, block, position in zip(rows.tolist(), blocks.tolist(), positions.tolist(), strict=True):
            held, j = self._held[row], position // bs
            if j <= len(held) and self._length[row] >= position:
                held[j:] = [(block, int(self.epoch[block]))]
                self._length[row] = position + 1
            else:
                self.forget(row)

    def scatter(self, values: list[np.ndarray], table: np.ndarray, start: int) -> None:
        """``values`` (per layer and kind ``[kv_heads, n, head_dim]``) are positions ``start ..`` of the sequence
        whose blocks ``table`` names: into the pool."""
        bs = self.block_size
        n = values[0].shape[1]
        for j in range(start // bs, -(-(start + n) // bs)):
            lo, hi = max(start, j * bs), min(start + n, (j + 1) * bs)
            for pool, kv in zip(self.pool, values, strict=True):
                pool[table[j], :, lo - j * bs : hi - j * bs] = kv[:, lo - start : hi - start]
            self.epoch[table[j]] += 1
