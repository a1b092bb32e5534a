"""Speculative decoding's proposal and acceptance rules (``speculative.py`` runs the rounds).

Greedy: the draft proposes its argmax, and a proposal is kept while it is the target's argmax, so the
output is the target's own greedy output whatever the draft. Sampled: the draft's proposals are drawn
from its distribution ``q``, and the standard rejection rule (Leviathan et al. 2023, Chen et al. 2023)
keeps ``d`` with probability ``min(1, p(d) / q(d))``: the output is distributed as the target's own
sampling.
"""

from __future__ import annotations

import numpy as np

from aotforge.targets.generative.sampling import Sampler


class Greedy:
    """Greedy proposals and acceptance: the output is the target's greedy output, whatever the draft."""

    def start_round(self) -> None:
        pass

    def propose(self, logits: np.ndarray, out: np.ndarray) -> None:
        logits.argmax(axis=-1, out=out)

    def accept(self, row: int, proposals: list[int], logits: np.ndarray) -> tuple[int, int]:
        return accept_greedy(proposals, logits)


class Sampled:
    """Proposals drawn from the draft's distribution ``q`` (kept for the round), the rejection rule on them."""

    def __init__(self, sample: Sampler) -> None:
        self.sample = sample
        self.q: list[np.ndarray] = []  # per proposal step: [batch, vocab]

    def start_round(self) -> None:
        self.q = []

    def propose(self, logits: np.ndarray, out: np.ndarray) -> None:
        probs = np.stack([self.sample.distribution(row) for row in logits])
        self.q.append(probs)
        out[:] = [self.sample.draw(p) for p in probs]

    def accept(self, row: int, proposals: list[int], logits: np.ndarray) -> tuple[int, int]:
        return accept_sampled(proposals, logits, [q[row] for q in self.q], self.sample)


def accept_greedy(proposals: list[int], logits: np.ndarray) -> tuple[int, int]:
    """How many proposals the target's argmax agrees with, then the target's own next token."""
    best = logits.argmax(axis=-1).tolist()
    kept = 0
    while kept < len(proposals) and best[kept] == proposals[kept]:
        kept += 1
    return kept, int(best[kept])


def accept_sampled(
    proposals: list[int], logits: np.ndarray, draft_probs: list[np.ndarray], sample: Sampler
) -> tuple[int, int]:
    """The rejection rule: keep ``d`` with probability ``min(1, p(d)/q(d))``; the first rejection draws from
    ``norm(max(0, p - q))``; all kept draws the bonus from ``p`` at the position after the last."""
    for i, d in enumerate(proposals):
        p, q = sample.distribution(logits[i]), draft_probs[i]
        if sample.rng.random() < min(1.0, p[d] / q[d]):
            continue
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        return i, sample.draw(residual / total if total > 0 else p)
    return len(proposals), sample.draw(sample.distribution(logits[len(proposals)]))
