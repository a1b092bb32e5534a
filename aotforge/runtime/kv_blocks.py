"""The KV cache's blocks: a fixed pool handed out as sequences grow and taken back when they end.

As vLLM's ``KVCacheManager``: every sequence holds a table of blocks of ``block_size`` token positions, so
what it is charged is its length rounded up to a block, never the model's whole context; admission and
preemption are decided on the free blocks. Where the keys and values physically live is the runner's:
the CPU runners keep each running sequence in a slot (``slots.SlotTable``), and a prefix is reused by slot.
"""

from __future__ import annotations


class KVBlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))
        self.tables: dict[str, list[int]] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def usage(self) -> float:
        return self.num_used / self.num_blocks if self.num_blocks else 0.0

    def allocate(self, seq_id: str, num_tokens: int) -> bool:
        """Grow ``seq_id``'s table to hold ``num_tokens`` positions; False, nothing changed, if the pool is short."""
        table = self.tables.setdefault(seq_id, [])
        need = -(-num_tokens // self.block_size) - len(table)
        if need > len(self._free):
            return False
        for _ in range(max(need, 0)):
            table.append(self._free.pop())
        return True

    def free(self, seq_id: str) -> None:
        self._free += reversed(self.tables.pop(seq_id, []))
