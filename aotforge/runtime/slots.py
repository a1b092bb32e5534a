"""The runner's cache slots: which are free, and which tokens each holds the KV of (prefix reuse).

A slot whose sequence ended keeps its keys and values until it is given to another sequence, as
llama.cpp's server keeps a slot's prompt cache: a later prompt that starts with the same tokens takes
that slot (or a copy of its prefix, if the slot is running) and computes only the rest.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Reuse:
    slot: int
    #: the slot whose first ``length`` positions the new sequence reuses (``slot`` itself, another, or -1)
    source: int
    length: int


class SlotTable:
    def __init__(self, num_slots: int, block_size: int) -> None:
        self.block_size = block_size
        self.held: list[list[int]] = [[] for _ in range(num_slots)]
        self.busy = [False] * num_slots
        #: free slots, least recently released first (the one to overwrite when no prefix matches)
        self._released: list[int] = list(range(num_slots))

    @property
    def num_free(self) -> int:
        return self.busy.count(False)

    def take(self, prompt: list[int], reuse: bool) -> Reuse:
        """A free slot for ``prompt`` and the longest block-aligned prefix of it some slot holds (never the
        last prompt token: its logits must be computed). Prefers a free slot that holds the prefix itself."""
        best = Reuse(slot=-1, source=-1, length=0)
        if reuse:
            limit = (len(prompt) - 1) // self.block_size * self.block_size
            for slot, held in enumerate(self.held):
                n = _common_blocks(held, prompt, limit, self.block_size)
                if n > best.length or (n == best.length and n and not self.busy[slot] and self.busy[best.source]):
                    best = Reuse(slot=-1, source=slot, length=n)
        if best.length and not self.busy[best.source]:
            slot = best.source
        else:
            slot = next(s for s in self._released if not self.busy[s] and s != best.source)
        self._released.remove(slot)
        self.busy[slot] = True
        if best.source != slot:  # the slot's old contents are overwritten (a copied prefix, then the prompt)
            self.held[slot] = []
        best.slot = slot
        return best

    def record(self, slot: int, tokens: list[int]) -> None:
        """``slot`` now holds the KV of exactly ``tokens``."""
        self.held[slot] = tokens

    def release(self, slot: int, keep: list[int]) -> None:
        """``slot``'s sequence ended: it stays free holding ``keep`` (empty: nothing reusable)."""
        self.busy[slot] = False
        self.held[slot] = keep
        self._released.append(slot)

    def safe_position(self, slot: int, max_seq_len: int) -> int:
        """Where a decode row that computes nothing for ``slot`` may write without harming what it holds."""
        return min(len(self.held[slot]), max_seq_len - 1)


def _common_blocks(held: list[int], prompt: list[int], limit: int, block_size: int) -> int:
    n = 0
    top = min(len(held), limit)
    while n + block_size <= top and held[n : n + block_size] == prompt[n : n + block_size]:
        n += block_size
    return n
