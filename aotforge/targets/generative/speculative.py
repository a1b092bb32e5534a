"""Speculative decoding: a small draft artifact proposes ``k`` tokens, the target checks them in one pass.

Each round, per slot (``length`` = tokens in the target's cache, ``last`` = the newest token, not
yet in any cache):

1. the draft decodes ``last`` and then its own proposals ``d1 .. d(k-1)`` at ``length ..``, proposing
   ``d1 .. dk`` (greedy, or sampled from the draft's distribution ``q``);
2. the target's verify graph runs ``[last, d1 .. dk]`` at ``length .. length + k`` in one call:
   logits for each of the ``k + 1`` positions;
3. greedy: ``d(i+1)`` is kept while it is the target's argmax at position ``i``; the first
   disagreement is replaced by the target's token (and if all ``k`` agree, the target's token after
   ``dk`` comes free). Sampled: the standard rule (Leviathan et al. 2023, Chen et al. 2023): keep
   ``d`` with probability ``min(1, p(d) / q(d))``, else draw from ``max(0, p - q)`` normalized and
   stop; all kept: draw the bonus from ``p``. The output is then distributed as the target's own
   sampling; seeded, it repeats exactly.
4. rollback is the position: ``length`` moves to ``length + accepted + 1`` in both caches. What the
   rejected proposals wrote beyond it stays in the buffers, masked (every query attends to positions
   ``<= its own``) until a later token overwrites it.

The draft's cache is one token behind after a round that kept all ``k`` (``dk`` was proposed, never
decoded by the draft): the next round first decodes it (rows that are not behind decode ``last`` at
``length``, which writes what their first proposal step writes again). Slots advance independently;
a finished slot stays where it is. Near the end of either cache, or with one token left to make,
the rest is plain target decoding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from aotforge.core.errors import InputSpecError
from aotforge.targets.generative.decoding import StepEngine, check_fits, pack_prompts
from aotforge.targets.generative.sampling import Sampler, SamplingOptions


class VerifyEngine(StepEngine, Protocol):
    #: The most query tokens one verify call takes (``speculative_k + 1`` of the build).
    verify_width: int

    def verify(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        """``input_ids [batch, w]`` written at ``write_pos .. + w - 1`` in place -> ``logits [batch, w, vocab]``."""
        ...

    def verify_positions(self, width: int) -> int:
        """Cache positions a verify call of ``width`` tokens writes from ``write_pos`` (a padded graph: more)."""
        ...


def stream_speculative(
    engine: VerifyEngine,
    draft: StepEngine,
    input_ids: np.ndarray,
    max_new_tokens: int,
    num_speculative_tokens: int,
    attention_mask: np.ndarray | None = None,
    sampling: SamplingOptions | None = None,
    eos_token_id: int | None = None,
    stats: dict[str, Any] | None = None,
) -> Iterator[np.ndarray]:
    """As ``decoding.stream_tokens``: each step's tokens ``[batch]`` (finished slots repeat ``eos_token_id``).

    ``stats`` (if given) is filled with ``proposed`` / ``accepted`` draft tokens, ``rounds`` (verify
    calls), ``draft_calls`` and ``plain_steps`` (target decode steps outside rounds)."""
    k = int(num_speculative_tokens)
    if not 1 <= k < engine.verify_width:
        raise InputSpecError(
            f"num_speculative_tokens must be in 1..{engine.verify_width - 1} (the target's verify graph takes "
            f"{engine.verify_width} tokens: rebuild it with a larger --speculative-k for more), got {k}"
        )
    packed, lengths = pack_prompts(input_ids, attention_mask)
    batch, longest = packed.shape[0], int(lengths.max())
    check_fits(engine.spec, batch, longest, max_new_tokens)
    if batch > draft.spec.max_batch or longest > draft.spec.max_seq_len:
        raise InputSpecError(
            f"the draft artifact holds batch {draft.spec.max_batch} x {draft.spec.max_seq_len} positions, this call "
            f"needs batch {batch} with prompts of up to {longest} tokens: rebuild the draft with a larger "
            "--max-batch / --max-seq-len"
        )
    counts = {"proposed": 0, "accepted": 0, "rounds": 0, "draft_calls": 0, "plain_steps": 0}
    sample = Sampler(sampling or SamplingOptions())
    greedy = not sample.options.do_sample
    engine.start(batch, packed.shape[1])
    draft.start(batch, packed.shape[1])
    mask = (np.arange(packed.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
    positions = np.broadcast_to(np.arange(packed.shape[1], dtype=np.int64), packed.shape).copy()
    logits = engine.prefill(packed, mask, positions)
    draft.prefill(packed, mask, positions)
    history = [list(row[:n]) for row, n in zip(packed.tolist(), lengths.tolist(), strict=True)]
    out: list[list[int]] = [[] for _ in range(batch)]
    done = [False] * batch  # Python lists and ints in the loop: at a small model's step, numpy calls add up
    yielded = 0

    def emit(row: int, tokens: list[int]) -> None:
        for t in tokens:
            if done[row] or len(out[row]) >= max_new_tokens:
                return
            out[row].append(int(t))
            history[row].append(int(t))
            if eos_token_id is not None and t == eos_token_id:
                done[row] = True

    def ready() -> Iterator[np.ndarray]:
        nonlocal yielded
        while yielded < max_new_tokens:
            if all(done) and yielded >= max(len(o) for o in out):
                return  # every sequence ended: no columns of eos only
            column = []
            for row in range(batch):
                if yielded < len(out[row]):
                    column.append(out[row][yielded])
                elif done[row] and eos_token_id is not None:
                    column.append(eos_token_id)
                else:
                    return
            yielded += 1
            yield np.array(column, dtype=np.int64)

    for row, token in enumerate(sample(logits).tolist()):
        emit(row, [token])
    yield from ready()
    length = lengths.copy()  # tokens of each slot in the target's cache (and the draft's, after catch-up)
    draft_len = lengths.copy()
    plain = False
    try:
        while yielded < max_new_tokens and not _finished(out, done, max_new_tokens):
            slots = [r for r in range(batch) if not done[r] and len(out[r]) < max_new_tokens]
            last = np.array([h[-1] for h in history], dtype=np.int64)
            left = max(max_new_tokens - len(out[r]) for r in slots)
            kk = min(k, left - 1)
            front = max(int(length[r]) for r in slots)
            if (
                plain
                or kk < 1
                or front + engine.verify_positions(kk + 1) > engine.spec.max_seq_len
                or front + kk + 1 > draft.spec.max_seq_len
            ):
                plain = True  # the rest decodes plainly: the draft falls behind for good
                step = sample(engine.decode(last[:, None], length))
                counts["plain_steps"] += 1
                for slot in slots:
                    emit(slot, [int(step[slot])])
                    length[slot] += 1
                yield from ready()
                continue
            behind = draft_len < length
            if behind.any():  # the last round kept all k: the draft has not decoded its own dk yet
                missed = [h[d] if d < len(h) else 0 for h, d in zip(history, draft_len.tolist(), strict=True)]
                fix = np.where(behind, missed, last)
                draft.decode(fix[:, None], np.where(behind, draft_len, length))
                counts["draft_calls"] += 1
                draft_len = length.copy()
            proposals = np.zeros((batch, kk), dtype=np.int64)
            draft_probs: list[np.ndarray] = []
            token = last
            for i in range(kk):
                d_logits = draft.decode(token[:, None], length + i)
                counts["draft_calls"] += 1
                if greedy:
                    token = d_logits.argmax(axis=-1)
                else:
                    probs = np.stack([sample.distribution(r) for r in d_logits])
                    draft_probs.append(probs)
                    token = np.array([sample.draw(p) for p in probs], dtype=np.int64)
                proposals[:, i] = token
            v_logits = engine.verify(np.concatenate([last[:, None], proposals], axis=1), length)
            counts["rounds"] += 1
            for r in slots:
                if greedy:
                    kept, extra = _accept_greedy(proposals[r], v_logits[r])
                else:
                    kept, extra = _accept_sampled(proposals[r], v_logits[r], [q[r] for q in draft_probs], sample)
                counts["proposed"] += kk
                counts["accepted"] += kept
                emit(r, [*proposals[r, :kept].tolist(), extra])
                length[r] += kept + 1
                draft_len[r] = min(int(length[r]), int(draft_len[r]) + kk)
            yield from ready()
        yield from ready()
    finally:
        if stats is not None:
            stats.update(counts)
            stats["acceptance_rate"] = counts["accepted"] / counts["proposed"] if counts["proposed"] else 0.0


def _finished(out: list[list[int]], done: list[bool], max_new_tokens: int) -> bool:
    return all(d or len(o) >= max_new_tokens for o, d in zip(out, done, strict=True))


def _accept_greedy(proposals: np.ndarray, logits: np.ndarray) -> tuple[int, int]:
    """How many proposals the target's argmax agrees with, then the target's own next token."""
    best = logits.argmax(axis=-1).tolist()
    proposed = proposals.tolist()
    kept = 0
    while kept < len(proposed) and best[kept] == proposed[kept]:
        kept += 1
    return kept, int(best[kept])


def _accept_sampled(
    proposals: np.ndarray, logits: np.ndarray, draft_probs: list[np.ndarray], sample: Sampler
) -> tuple[int, int]:
    """The rejection rule: keep ``d`` with probability ``min(1, p(d)/q(d))``; the first rejection draws from
    ``norm(max(0, p - q))``; all kept draws the bonus from ``p`` at the position after the last."""
    for i, d in enumerate(proposals.tolist()):
        p, q = sample.distribution(logits[i]), draft_probs[i]
        if sample.rng.random() < min(1.0, p[d] / q[d]):
            continue
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        return i, sample.draw(residual / total if total > 0 else p)
    return len(proposals), sample.draw(sample.distribution(logits[len(proposals)]))


def generate_speculative(
    engine: VerifyEngine,
    draft: StepEngine,
    input_ids: np.ndarray,
    max_new_tokens: int,
    num_speculative_tokens: int,
    attention_mask: np.ndarray | None = None,
    sampling: SamplingOptions | None = None,
    eos_token_id: int | None = None,
    stats: dict[str, Any] | None = None,
) -> np.ndarray:
    """``input_ids`` as given, then the new tokens (``decoding.generate_tokens`` with a draft)."""
    ids = np.asarray(input_ids)
    ids = ids[None, :] if ids.ndim == 1 else ids
    steps = list(
        stream_speculative(
            engine, draft, ids, max_new_tokens, num_speculative_tokens, attention_mask, sampling, eos_token_id, stats
        )
    )
    return np.concatenate([ids.astype(np.int64), np.stack(steps, axis=1)], axis=1)
