"""Perplexity through an artifact's prefill + decode steps: windowing, batching and refusals.

The scoring is checked against a step engine whose next-token distribution is a fixed bigram table
(exact perplexity known in closed form); the same function on real artifacts is compared with torch
in tests/test_generative.py and gates quantization in tests/test_weight_only_decoder.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import InputSpecError
from aotforge.targets.generative.perplexity import perplexity

VOCAB = 7


class BigramEngine:
    """Logits of the next token depend on the current token only; checks the cache positions it is given."""

    def __init__(self, max_seq_len: int = 8, max_batch: int = 2) -> None:
        self.spec = DecoderSpec(1, 1, 4, VOCAB, max_seq_len, max_batch)
        self.table = np.log(np.random.default_rng(0).dirichlet(np.ones(VOCAB), size=VOCAB)).astype(np.float32)
        self.batches: list[int] = []

    def start(self, batch: int, prompt_len: int) -> None:
        assert batch <= self.spec.max_batch
        self.batches.append(batch)
        self.filled = np.zeros(batch, dtype=np.int64)

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        assert input_ids.shape[1] == 1 and (position_ids == 0).all()
        self.filled[:] = 1
        return self.table[input_ids[:, 0]] + 3.0  # shifted logits: the softmax must not care

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        assert (write_pos == self.filled).all() and (write_pos < self.spec.max_seq_len).all()
        self.filled += 1
        return self.table[input_ids[:, 0]]


def _expected(engine: BigramEngine, ids: list[int], window: int) -> float:
    nll, count = 0.0, 0
    for start in range(0, len(ids), window):
        chunk = ids[start : start + window]
        for a, b in zip(chunk, chunk[1:], strict=False):
            nll -= float(engine.table[a, b])
            count += 1
    return math.exp(nll / count)


@pytest.mark.parametrize(("length", "window"), [(20, 4), (21, 4), (22, 9), (9, 9), (30, 3)])
def test_windows_score_every_token_after_the_first_of_each(length: int, window: int) -> None:
    engine = BigramEngine()
    ids = np.random.default_rng(length).integers(0, VOCAB, size=length)
    got = perplexity(engine, ids, window)
    full, rest = divmod(length, window)
    assert got.windows == full + (rest >= 2)
    assert got.scored_tokens == full * (window - 1) + max(rest - 1, 0)
    assert got.perplexity == pytest.approx(_expected(engine, ids.tolist(), window), rel=1e-6)
    assert max(engine.batches) <= engine.spec.max_batch and len(engine.batches) < got.windows + 1


def test_the_default_window_fills_the_cache() -> None:
    engine = BigramEngine(max_seq_len=8)
    got = perplexity(engine, np.arange(40) % VOCAB)
    assert got.window == 9 and got.scored_tokens == 4 * 8 + 3


def test_refusals_name_the_limit() -> None:
    engine = BigramEngine(max_seq_len=8)
    with pytest.raises(InputSpecError, match="max_seq_len=8: use a window of 2 to 9"):
        perplexity(engine, np.arange(20) % VOCAB, window=10)
    with pytest.raises(InputSpecError, match="at least 2 tokens"):
        perplexity(engine, np.array([3]))
    with pytest.raises(InputSpecError, match=r"\[0, 7\)"):
        perplexity(engine, np.array([1, 2, 7]))
