"""What proposes a speculative round's tokens (``speculative.py`` runs the rounds, verifies and accepts).

Two kinds: a draft artifact with a KV cache of its own (:class:`ArtifactDraft`: it decodes, and catches up on
what a round kept), and a feature draft (:class:`FeatureProposer`: no cache, it chains from the target's own
LM-head input). Both write their proposals into the round's verify input through the acceptance rule, which draws
them from logits over the target's vocabulary (greedy: argmax; sampled: from the draft's ``q``).
"""

from __future__ import annotations

from typing import Protocol, cast

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import InputSpecError
from aotforge.targets.generative.acceptance import Greedy, Sampled
from aotforge.targets.generative.decoding import StepEngine
from aotforge.targets.generative.feature_draft import FeatureDraft


class Proposer(Protocol):
    def prefill(self, packed: np.ndarray, mask: np.ndarray, positions: np.ndarray, length: list[int]) -> None:
        """After the target's prefill of ``packed`` (``length``: each slot's prompt): the draft's own start."""

    def fits(self, front: int, kk: int) -> bool:
        """Whether a round of ``kk`` proposals from slots filled up to ``front`` fits the draft."""
        ...

    def propose(
        self, history: list[list[int]], length: list[int], ids: np.ndarray, pos: np.ndarray, rule: Greedy | Sampled
    ) -> int:
        """Write ``d1 .. dk`` into ``ids[:, 1:]`` (``ids[:, 0]``: each slot's last token, to go at ``pos``), each
        drawn by ``rule.propose``; returns the draft calls made."""
        ...

    def accepted(self, row: int, kept: int, length: int) -> None:
        """Slot ``row`` kept ``kept`` proposals and the target's token after them; it now holds ``length``."""


class HiddenEngine(Protocol):
    spec: DecoderSpec
    #: The LM head's input size the target's prefill and verify graphs return (0: they return none).
    hidden_size: int

    def hidden(self) -> np.ndarray:
        """The last prefill's ``[batch, d]`` or verify call's ``[batch, w, d]`` LM-head input."""
        ...


def proposer_for(draft: StepEngine | FeatureDraft, engine: StepEngine, batch: int, longest: int) -> Proposer:
    """The proposer of ``draft`` for a call of ``batch`` prompts of up to ``longest`` tokens; refusals first."""
    if isinstance(draft, FeatureDraft):
        return FeatureProposer(draft, engine)
    return ArtifactDraft(draft, batch, longest)


class ArtifactDraft:
    """A draft artifact with a KV cache of its own (``speculative``'s module docstring: its rounds)."""

    def __init__(self, draft: StepEngine, batch: int, longest: int) -> None:
        if batch > draft.spec.max_batch or longest > draft.spec.max_seq_len:
            raise InputSpecError(
                f"the draft artifact holds batch {draft.spec.max_batch} x {draft.spec.max_seq_len} positions, this "
                f"call needs batch {batch} with prompts of up to {longest} tokens: rebuild the draft with a larger "
                "--max-batch / --max-seq-len"
            )
        self.draft = draft
        self.draft_len: list[int] = []  # tokens of each slot in the draft's cache (one behind after all k kept)
        self.kk = 0

    def prefill(self, packed: np.ndarray, mask: np.ndarray, positions: np.ndarray, length: list[int]) -> None:
        self.draft.start(packed.shape[0], packed.shape[1])
        self.draft.prefill(packed, mask, positions)
        self.draft_len = list(length)

    def fits(self, front: int, kk: int) -> bool:
        return front + kk + 1 <= self.draft.spec.max_seq_len

    def propose(
        self, history: list[list[int]], length: list[int], ids: np.ndarray, pos: np.ndarray, rule: Greedy | Sampled
    ) -> int:
        draft_len, calls, self.kk = self.draft_len, 0, ids.shape[1] - 1
        behind = draft_len != length  # (never ahead) the last round kept all k: the draft has not decoded dk
        fold = behind and self._draft_folds(max(length))
        if behind and not fold:
            late = [d < n for d, n in zip(draft_len, length, strict=True)]
            fix = [h[d] if b else h[-1] for h, d, b in zip(history, draft_len, late, strict=True)]
            at = [d if b else n for d, n, b in zip(draft_len, length, late, strict=True)]
            self.draft.decode(np.array(fix, dtype=np.int64)[:, None], np.array(at, dtype=np.int64))
            calls += 1  # (rows not behind decode last, which their first step writes again)
        draft_len[:] = length
        for i in range(self.kk):
            if fold and not i:  # dk and last in one call of the draft's own verify graph
                pair = np.array([h[n - 1 : n] + h[-1:] for h, n in zip(history, length, strict=True)], dtype=np.int64)
                d_logits = self.draft.verify(pair, pos - 1)[:, 1]  # type: ignore[attr-defined]
            else:
                d_logits = self.draft.decode(ids[:, i : i + 1], pos + i if i else pos)
            rule.propose(d_logits, out=ids[:, i + 1])
        return calls + self.kk

    def accepted(self, row: int, kept: int, length: int) -> None:
        self.draft_len[row] = min(length, self.draft_len[row] + self.kk)

    def _draft_folds(self, front: int) -> bool:
        """Whether the draft catches up inside its first proposal step: a draft built with a verify graph
        (``--speculative-k``) runs ``[dk, last]`` in one call where another would decode ``dk`` alone first."""
        width = int(getattr(self.draft, "verify_width", 0))
        return width >= 2 and front - 1 + self.draft.verify_positions(2) <= self.draft.spec.max_seq_len  # type: ignore[attr-defined]


class FeatureProposer:
    """A feature draft (``feature_draft``): proposals chained from the target's LM-head input ``h`` at the
    position whose logits gave each slot's last token; after a round, ``h`` is the verify call's at the position
    whose logits gave the new last token. No cache: nothing to catch up on or roll back."""

    def __init__(self, draft: FeatureDraft, engine: StepEngine) -> None:
        size = int(getattr(engine, "hidden_size", 0))
        if not size:
            raise InputSpecError(
                "this artifact's prefill and verify graphs return no hidden state for a feature draft: rebuild it "
                "with --speculative-k K with this aotforge (artifacts built before return none)"
            )
        draft.check_target(size, engine.spec.vocab, "this artifact")
        self.draft, self.engine = draft, cast(HiddenEngine, engine)
        self.hidden = np.zeros((0, size), dtype=np.float32)
        # Logits over the target's vocabulary: -inf outside the draft's sub-vocabulary, so a sampled q is 0 there.
        self.logits = np.zeros((0, engine.spec.vocab), dtype=np.float32)

    def prefill(self, packed: np.ndarray, mask: np.ndarray, positions: np.ndarray, length: list[int]) -> None:
        self.hidden = np.array(self.engine.hidden(), dtype=np.float32)  # a copy: rows are replaced as slots move
        self.logits = np.full((packed.shape[0], self.engine.spec.vocab), -np.inf, dtype=np.float32)

    def fits(self, front: int, kk: int) -> bool:
        return True

    def propose(
        self, history: list[list[int]], length: list[int], ids: np.ndarray, pos: np.ndarray, rule: Greedy | Sampled
    ) -> int:
        hidden, vocab_ids = self.hidden, self.draft.weights["vocab_ids"]
        for i in range(ids.shape[1] - 1):  # the draft's step runs on one thread of its own (feature_draft_step)
            hidden, sub = self.draft.step(hidden, ids[:, i])
            if isinstance(rule, Greedy):  # the sub-vocabulary's argmax: no scatter into the whole vocabulary
                ids[:, i + 1] = vocab_ids[sub.argmax(axis=-1)]
            else:
                self.logits[:, vocab_ids] = sub
                rule.propose(self.logits, out=ids[:, i + 1])
        return ids.shape[1] - 1

    def accepted(self, row: int, kept: int, length: int) -> None:
        self.hidden[row] = self.engine.hidden()[row, kept]
