"""A draft that speaks a subset of its target's vocabulary (FR-Spec, Zhao et al. 2025): its LM head holds only the
most frequent tokens, so a draft step skips most of the head's matmul, the largest part of a small model's step.

The draft's token ``i`` is the target's ``ids[i]``; any target token outside the subset reads as the draft's
``unknown``. :class:`SubVocabEngine` wraps the draft's step engine so the speculative loop sees a draft over the
target's vocabulary: inputs mapped into the draft's ids, logits scattered back with ``-inf`` for every token the
draft cannot propose. The target still verifies every proposal, so greedy output stays the target's own, and the
sampled rule stays exact (the draft's ``q`` is 0 outside the subset).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.errors import DraftMismatchError
from aotforge.targets.generative.decoding import StepEngine


@dataclasses.dataclass(frozen=True)
class DraftVocab:
    """The target's token id of each draft token, and the draft token every other target token reads as."""

    ids: np.ndarray
    unknown: int

    def to_draft(self, full_vocab: int) -> np.ndarray:
        """The lookup table from the target's token ids (``full_vocab`` of them) to the draft's."""
        table = np.full(full_vocab, self.unknown, dtype=np.int64)
        table[self.ids] = np.arange(len(self.ids), dtype=np.int64)
        return table

    def write(self, path: Path) -> None:
        path.write_text(json.dumps({"ids": [int(i) for i in self.ids], "unknown": int(self.unknown)}) + "\n")

    @classmethod
    def read(cls, path: Path, full_vocab: int, draft_vocab: int) -> DraftVocab:
        """The map at ``path``, checked against the two vocabularies (refused by name otherwise)."""
        data = json.loads(path.read_text())
        ids, unknown = np.asarray(data["ids"], dtype=np.int64), int(data["unknown"])
        if (
            len(ids) != draft_vocab
            or not 0 <= unknown < draft_vocab
            or len(np.unique(ids)) != len(ids)
            or ids.min() < 0
            or ids.max() >= full_vocab
        ):
            raise DraftMismatchError(
                f"{path}: a draft vocabulary of {len(ids)} distinct ids below {full_vocab} (unknown {unknown}) is "
                f"expected for a draft of {draft_vocab} tokens and a target of {full_vocab}: rebuild the draft from "
                "`aotforge distill --draft-vocab`'s output"
            )
        return cls(ids, unknown)


class SubVocabEngine:
    """The draft's step engine seen over the target's vocabulary (see the module docstring)."""

    def __init__(self, inner: StepEngine, vocab: DraftVocab, full_vocab: int) -> None:
        self.inner, self.spec, self.full_vocab = inner, inner.spec, full_vocab
        self.ids, self.table = vocab.ids, vocab.to_draft(full_vocab)
        #: A draft built with a verify graph folds its catch-up step into its first proposal (``speculative``).
        self.verify_width = int(getattr(inner, "verify_width", 0))

    def start(self, batch: int, prompt_len: int) -> None:
        self.inner.start(batch, prompt_len)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        return self._scatter(self.inner.prefill(self.table[input_ids], attention_mask, position_ids))

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        return self._scatter(self.inner.decode(self.table[input_ids], write_pos))

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        return self._scatter(self.inner.verify(self.table[input_ids], write_pos))  # type: ignore[attr-defined]

    def verify_positions(self, width: int) -> int:
        return int(self.inner.verify_positions(width))  # type: ignore[attr-defined]

    def _scatter(self, logits: np.ndarray) -> np.ndarray:
        full = np.full((*logits.shape[:-1], self.full_vocab), -np.inf, dtype=np.float32)
        full[..., self.ids] = logits
        return full


def sub_vocab_runner(runner: Any, path: Path, full_vocab: int) -> Any:
    """``runner`` (a draft's ``GenerativeRunner``) over the target's vocabulary, by the map at ``path``."""
    from aotforge.targets.generative.runner import GenerativeRunner

    vocab = DraftVocab.read(path, full_vocab, int(runner.spec.vocab))
    return GenerativeRunner(SubVocabEngine(runner.engine, vocab, full_vocab))  # type: ignore[arg-type]
