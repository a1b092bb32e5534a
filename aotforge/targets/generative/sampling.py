"""Choosing the next token from logits: greedy, or sampling with temperature / top-k / top-p."""

from __future__ import annotations

import dataclasses

import numpy as np

from aotforge.core.errors import InputSpecError


@dataclasses.dataclass(frozen=True)
class SamplingOptions:
    """As transformers' ``generate`` names them; ``do_sample=False`` is greedy and ignores the rest."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise InputSpecError(f"temperature must be > 0, got {self.temperature}; use do_sample=False for greedy")
        if self.top_k < 0:
            raise InputSpecError(f"top_k must be >= 0 (0 keeps every token), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise InputSpecError(f"top_p must be in (0, 1], got {self.top_p}")


class Sampler:
    """One per ``generate`` call: its random generator is seeded once, so a seeded call repeats exactly."""

    def __init__(self, options: SamplingOptions) -> None:
        self.options = options
        self.rng = np.random.default_rng(options.seed)

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """``logits [batch, vocab]`` -> token ids ``[batch]`` (int64)."""
        if not self.options.do_sample:
            return logits.argmax(axis=-1).astype(np.int64)
        return np.array([self._sample(row) for row in logits], dtype=np.int64)

    def _sample(self, row: np.ndarray) -> int:
        order, probs = self._kept(row)
        return int(order[self.rng.choice(len(order), p=probs)])

    def _kept(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tokens temperature / top-k / top-p keep (best first) and their renormalized probabilities."""
        scaled = row.astype(np.float64) / self.options.temperature
        order = np.argsort(-scaled, kind="stable")
        if self.options.top_k > 0:
            order = order[: self.options.top_k]
        probs = np.exp(scaled[order] - scaled[order[0]])
        probs /= probs.sum()
        if self.options.top_p < 1.0:
            # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
            keep = int(np.searchsorted(np.cumsum(probs), self.options.top_p) + 1)
            order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
        return order, probs

    def distribution(self, row: np.ndarray) -> np.ndarray:
        """``logits [vocab]`` -> the full-vocabulary distribution ``__call__`` samples from (sampling only)."""
        order, probs = self._kept(row)
        out = np.zeros(row.shape[-1], dtype=np.float64)
        out[order] = probs
        return out

    def draw(self, probs: np.ndarray) -> int:
        """One token from a full-vocabulary distribution, with this sampler's generator."""
        return int(self.rng.choice(probs.shape[-1], p=probs))
