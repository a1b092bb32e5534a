"""Perplexity of a generative artifact on a token sequence, through its own prefill and decode graphs.

What a user gates a quantized build on: the same text scored by the fp32 artifact and by the int4 one.
The sequence is cut into non-overlapping windows of ``window`` tokens; each window starts a fresh
cache, its first token is prefilled and the rest decoded one by one, so every token after the
first of its window is scored given all earlier tokens of the window (``window - 1`` predictions,
``window - 1`` cache positions). Windows of equal length share a batch up to the artifact's
``max_batch``. The prefill graph returns only the last position's logits, so scoring through decode
steps is what reads every position; it is also the path generation takes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator

import numpy as np

from aotforge.core.errors import InputSpecError
from aotforge.targets.generative.decoding import StepEngine


@dataclasses.dataclass(frozen=True)
class Perplexity:
    perplexity: float
    #: Mean negative log-likelihood per scored token, in nats.
    nll: float
    scored_tokens: int
    window: int
    windows: int
    seconds: float

    def to_dict(self) -> dict[str, float | int]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}


def perplexity(engine: StepEngine, ids: np.ndarray, window: int | None = None) -> Perplexity:
    """exp(mean NLL) of ``ids`` (1-D token ids) under the artifact, scored window by window."""
    started = time.perf_counter()
    spec = engine.spec
    tokens = np.asarray(ids).reshape(-1).astype(np.int64)
    window = window or spec.max_seq_len + 1
    if not 2 <= window <= spec.max_seq_len + 1:
        raise InputSpecError(
            f"a perplexity window of {window} tokens needs {window - 1} KV-cache positions; the artifact holds "
            f"max_seq_len={spec.max_seq_len}: use a window of 2 to {spec.max_seq_len + 1}"
        )
    if len(tokens) < 2:
        raise InputSpecError(f"perplexity needs at least 2 tokens, got {len(tokens)}")
    if tokens.min() < 0 or tokens.max() >= spec.vocab:
        raise InputSpecError(f"token ids must lie in [0, {spec.vocab}), got {tokens.min()}..{tokens.max()}")
    total, scored, windows = 0.0, 0, 0
    for batch in window_batches(tokens, window, spec.max_batch):
        total += sum(_nll(logits, batch[:, pos]) for pos, logits in window_logits(engine, batch))
        scored, windows = scored + batch.size - len(batch), windows + len(batch)
    nll = total / scored
    return Perplexity(math.exp(nll), nll, scored, window, windows, time.perf_counter() - started)


def window_batches(tokens: np.ndarray, window: int, max_batch: int) -> Iterator[np.ndarray]:
    """Non-overlapping windows of ``window`` tokens (the last may be shorter; one of a single token is dropped),
    stacked ``[rows, length]`` by equal length, at most ``max_batch`` rows each."""
    chunks = [tokens[s : s + window] for s in range(0, len(tokens), window)]
    chunks = [c for c in chunks if len(c) >= 2]
    for length in sorted({len(c) for c in chunks}):
        same = [c for c in chunks if len(c) == length]
        for start in range(0, len(same), max_batch):
            yield np.stack(same[start : start + max_batch])


def window_logits(engine: StepEngine, batch: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """``(pos, logits [rows, vocab])`` predicting ``batch[:, pos]`` for pos 1.., each row its own slot from
    position 0: the first token prefilled, the rest decoded one by one."""
    rows, length = batch.shape
    engine.start(rows, 1)
    first = batch[:, :1]
    logits = engine.prefill(first, np.ones_like(first), np.zeros_like(first))
    for pos in range(1, length):
        yield pos, logits
        if pos < length - 1:
            logits = engine.decode(batch[:, pos : pos + 1], np.full(rows, pos, dtype=np.int64))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities over the last axis, in float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _nll(logits: np.ndarray, targets: np.ndarray) -> float:
    return float(-log_softmax(logits)[np.arange(len(targets)), targets].sum())
