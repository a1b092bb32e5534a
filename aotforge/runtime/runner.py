"""What a target gives the serving runtime: a model runner over a cache of sequence slots.

The runner only executes the step it is given (vLLM's split: the scheduler decides, the KV manager
hands out blocks, the runner runs). Each running sequence owns one slot of ``max_seq_len`` positions
per layer; the engine tells the runner which tokens go where.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from aotforge.core.decoder import DecoderSpec


class ModelRunner(Protocol):
    spec: DecoderSpec
    #: slots the cache holds (sequences that can run at once)
    num_slots: int
    #: True when ``extend`` runs (a prompt in chunks, or after a reused prefix); else every prompt is one ``prefill``
    can_extend: bool

    def prefill(self, slot: int, token_ids: np.ndarray) -> np.ndarray:
        """The whole prompt ``[n]`` into positions ``0 .. n-1`` of ``slot``; the last position's logits ``[vocab]``."""
        ...

    def extend(self, slot: int, token_ids: np.ndarray, start: int) -> np.ndarray:
        """``[n]`` tokens at positions ``start ..`` of ``slot``, attending to what it holds; the last logits."""
        ...

    def decode_rows(self, rows: int) -> int:
        """How many slots (from slot 0) a decode over the first ``rows`` slots computes (a target's bucket)."""
        ...

    def decode(self, token_ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """One token per slot ``0 .. b-1`` (``b = decode_rows(..)``) written at ``positions [b]``; ``[b, vocab]``."""
        ...

    def copy(self, src: int, dst: int, length: int) -> None:
        """Positions ``0 .. length-1`` of slot ``src``'s keys and values into slot ``dst`` (a reused prefix)."""
        ...
