"""The KV cache's blocks: which physical blocks each sequence's table holds, and which full blocks are cached.

As vLLM's ``KVCacheManager`` over its ``BlockPool``: a fixed pool of blocks of ``block_size`` token positions
that every sequence shares. A sequence's block table grows a block at a time as it does, so what it holds is
its length rounded up to a block, never the model's whole context. A block whose positions are all computed
is keyed by the hash of its tokens and of the prefix before them; a later prompt that starts with the same
tokens takes those blocks (reference-counted, never written again) and computes only the rest. A block no
sequence holds returns to the free queue, a cached one still findable until it is taken for new tokens:
blocks with no cached contents are taken first, then cached ones least recently freed first (LRU).

Block ids run from 1 to ``num_blocks``: the runner's pool has one block more, block 0, where the rows that
only pad a step write.
"""

from __future__ import annotations

import array
import collections
import hashlib
from collections.abc import Sequence

#: The block the rows padding a step read and write (never in a sequence's table).
SCRATCH_BLOCK = 0


class KVBlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_counts = [0] * (num_blocks + 1)
        #: free blocks, the next to take first (ordered dict as an indexable queue)
        self._free: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(range(1, num_blocks + 1))
        self._hash_of: dict[int, bytes] = {}  # block -> the hash of its contents (cached blocks only)
        self._block_of: dict[bytes, int] = {}  # hash -> block
        self.tables: dict[str, list[int]] = {}
        #: per sequence: the hashes of its first full blocks (those computed and keyed so far)
        self._hashes: dict[str, list[bytes]] = {}

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds (cached ones included: they are taken when needed)."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def usage(self) -> float:
        return self.num_used / self.num_blocks if self.num_blocks else 0.0

    @staticmethod
    def _chain(prefix_hash: bytes, tokens: Sequence[int]) -> bytes:
        """A block's key: SHA-256 of the prefix's key and the block's tokens (as vLLM's ``sha256`` option: a
        collision would hand a prompt another prompt's keys and values)."""
        return hashlib.sha256(prefix_hash + array.array("q", tokens).tobytes()).digest()

    def cached_prefix(self, tokens: Sequence[int]) -> list[int]:
        """The cached blocks that hold ``tokens``' longest block-aligned prefix, never its last token (whose
        logits must be computed)."""
        if not self.enable_caching:
            return []
        found: list[int] = []
        h = b""
        size = self.block_size
        for start in range(0, (len(tokens) - 1) // size * size, size):
            h = self._chain(h, tokens[start : start + size])
            block = self._block_of.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def allocate(self, seq_id: str, num_tokens: int, prefix: Sequence[int] = ()) -> bool:
        """Grow ``seq_id``'s table to hold ``num_tokens`` positions, starting it (first call) with the cached
        ``prefix`` blocks; False, nothing changed, if the pool is short."""
        table = self.tables.get(seq_id)
        start = table is None
        held = len(table) if table is not None else len(prefix)
        need = max(-(-num_tokens // self.block_size) - held, 0)
        idle = sum(1 for b in prefix if self.ref_counts[b] == 0) if start else 0  # cached blocks taken back
        if need + idle > len(self._free):
            return False
        if table is None:
            table = self.tables[seq_id] = []
            self._hashes[seq_id] = [self._hash_of[b] for b in prefix]
            for block in prefix:
                if self.ref_counts[block] == 0:
                    del self._free[block]
                self.ref_counts[block] += 1
                table.append(block)
        for _ in range(need):
            block, _ = self._free.popitem(last=False)
            old = self._hash_of.pop(block, None)
            if old is not None:  # evicted: its contents are about to be overwritten
                del self._block_of[old]
            self.ref_counts[block] = 1
            table.append(block)
        return True

    def cache_full_blocks(self, seq_id: str, tokens: Sequence[int]) -> None:
        """``tokens`` (the sequence so far, every position computed) are in ``seq_id``'s blocks: key each newly
        full block by its hash, for later prompts with the same prefix."""
        if not self.enable_caching:
            return
        hashes, table, size = self._hashes[seq_id], self.tables[seq_id], self.block_size
        for i in range(len(hashes), len(tokens) // size):
            h = self._chain(hashes[-1] if hashes else b"", tokens[i * size : (i + 1) * size])
            hashes.append(h)
            block = table[i]
            if h not in self._block_of and block not in self._hash_of:
                self._block_of[h], self._hash_of[block] = block, h

    def drop_cached(self) -> None:
        """Forget every cached block (the runner lost the pool's contents): no later prompt reuses them."""
        self._hash_of.clear()
        self._block_of.clear()

    def free(self, seq_id: str) -> None:
        """``seq_id``'s blocks back to the pool: uncached ones to be taken first, cached ones last, the end of a
        sequence before its start (a later prompt shares a prefix more often than the whole)."""
        self._hashes.pop(seq_id, None)
        for block in reversed(self.tables.pop(seq_id, [])):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free[block] = None
                if block not in self._hash_of:
                    self._free.move_to_end(block, last=False)
