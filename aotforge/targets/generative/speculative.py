"""Speculative decoding: a small draft proposes ``k`` tokens, the target checks them in one pass.

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
   sampling; seeded, it repeats exactly (the rules: ``acceptance.py``).
4. rollback is the position: ``length`` moves to ``length + accepted + 1`` in both caches. What the
   rejected proposals wrote beyond it stays in the buffers, masked (every query attends to positions
   ``<= its own``) until a later token overwrites it.

The draft's cache is one token behind after a round that kept all ``k`` (``dk`` was proposed, never
decoded by the draft): the next round first decodes it (rows that are not behind decode ``last`` at
``length``, which writes what their first proposal step writes again). Slots advance independently;
a finished slot stays where it is. Near the end of either cache, or with one token left to make,
the rest is plain target decoding.

A feature draft (``feature_draft``, ``draft=`` a loaded one or its directory) has no cache and proposes from the
target's own LM-head input: step 1 chains ``k`` proposals from the ``hidden`` the target returned at the position
whose logits gave ``last`` (prefill's last prompt token, then verify's position ``accepted``); steps 2-4 are the
same. What differs between the two kinds of draft lives in ``proposers.py``.

The loop keeps its per-slot state in Python lists and ints: at a small model's step (a tenth of a
millisecond for the trained draft of ``tests/lm_pair.py``) every numpy call on a one-row array is a
visible part of a round.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from aotforge.core.errors import InputSpecError
from aotforge.targets.generative.acceptance import Greedy, Sampled
from aotforge.targets.generative.decoding import StepEngine, StopIds, check_fits, pack_prompts, stop_ids
from aotforge.targets.generative.feature_draft import FeatureDraft
from aotforge.targets.generative.proposers import proposer_for
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


class _Speculation:
    """One call's state: the prefilled caches, each slot's tokens and positions; ``steps()`` advances it. What
    proposes (a draft artifact, a feature draft) is its ``proposer``; the rounds, the verify call and the
    acceptance are the same for both."""

    def __init__(
        self,
        engine: VerifyEngine,
        draft: StepEngine | FeatureDraft,
        input_ids: np.ndarray,
        max_new_tokens: int,
        k: int,
        attention_mask: np.ndarray | None,
        sampling: SamplingOptions | None,
        eos_token_id: StopIds,
    ) -> None:
        packed, lengths = pack_prompts(input_ids, attention_mask)
        batch, longest = packed.shape[0], int(lengths.max())
        check_fits(engine.spec, batch, longest, max_new_tokens)
        self.proposer = proposer_for(draft, engine, batch, longest)
        self.engine, self.k, self.eos = engine, k, stop_ids(eos_token_id)
        self.max_new, self.batch = max_new_tokens, batch
        self.sample = Sampler(sampling or SamplingOptions())
        self.rule: Greedy | Sampled = Sampled(self.sample) if self.sample.options.do_sample else Greedy()
        self.counts = {"proposed": 0, "accepted": 0, "rounds": 0, "draft_calls": 0, "plain_steps": 0}
        engine.start(batch, packed.shape[1])
        mask = (np.arange(packed.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
        positions = np.broadcast_to(np.arange(packed.shape[1], dtype=np.int64), packed.shape).copy()
        self.first_logits = engine.prefill(packed, mask, positions)
        self.history = [list(row[:n]) for row, n in zip(packed.tolist(), lengths.tolist(), strict=True)]
        self.out: list[list[int]] = [[] for _ in range(batch)]
        self.done = [False] * batch
        self.length: list[int] = lengths.tolist()  # tokens of each slot in the target's cache
        self.proposer.prefill(packed, mask, positions, self.length)
        self.plain = False

    def emit(self, row: int, tokens: list[int]) -> None:
        out, history = self.out[row], self.history[row]
        for t in tokens:
            if self.done[row] or len(out) >= self.max_new:
                return
            out.append(t)
            history.append(t)
            if t in self.eos:
                self.done[row] = True

    def unfinished(self) -> list[int]:
        """The slots still making tokens (not ended at eos, fewer than ``max_new_tokens``)."""
        return [r for r, (o, d) in enumerate(zip(self.out, self.done, strict=True)) if not d and len(o) < self.max_new]

    def steps(self) -> Iterator[None]:
        """Advance until every slot is finished, pausing after each step (a round or a plain token)."""
        for row, token in enumerate(self.sample(self.first_logits).tolist()):
            self.emit(row, [token])
        yield
        while slots := self.unfinished():
            kk = min(self.k, self.max_new - min(len(self.out[r]) for r in slots) - 1)
            front = max(self.length[r] for r in slots)
            self.plain = (
                self.plain
                or kk < 1
                or front + self.engine.verify_positions(kk + 1) > self.engine.spec.max_seq_len
                or not self.proposer.fits(front, kk)
            )  # once plain, the rest decodes plainly: the draft falls behind for good
            self._plain_step(slots) if self.plain else self._round(slots, kk)
            yield

    def _plain_step(self, slots: list[int]) -> None:
        last = np.array([h[-1] for h in self.history], dtype=np.int64)
        step = self.sample(self.engine.decode(last[:, None], np.array(self.length, dtype=np.int64))).tolist()
        self.counts["plain_steps"] += 1
        for slot in slots:
            self.emit(slot, [step[slot]])
            self.length[slot] += 1

    def _round(self, slots: list[int], kk: int) -> None:
        length, counts = self.length, self.counts
        # [last, d1 .. dk] per slot: the verify call's input, each proposal written into it as it is drawn
        # (column i is also the draft's input at step i).
        ids = np.empty((self.batch, kk + 1), dtype=np.int64)
        ids[:, 0] = [h[-1] for h in self.history]
        pos = np.array(length, dtype=np.int64)
        self.rule.start_round()
        self.counts["draft_calls"] += self.proposer.propose(self.history, length, ids, pos, self.rule)
        logits = self.engine.verify(ids, pos)
        counts["rounds"] += 1
        proposed = ids[:, 1:].tolist()
        for r in slots:
            kept, extra = self.rule.accept(r, proposed[r], logits[r])
            counts["proposed"] += kk
            counts["accepted"] += kept
            self.emit(r, [*proposed[r][:kept], extra])
            length[r] += kept + 1
            self.proposer.accepted(r, kept, length[r])

    def stats(self) -> dict[str, Any]:
        proposed = self.counts["proposed"]
        return {**self.counts, "acceptance_rate": self.counts["accepted"] / proposed if proposed else 0.0}


def _advance(
    engine: VerifyEngine,
    draft: StepEngine | FeatureDraft,
    input_ids: np.ndarray,
    max_new_tokens: int,
    num_speculative_tokens: int,
    attention_mask: np.ndarray | None,
    sampling: SamplingOptions | None,
    eos_token_id: StopIds,
    stats: dict[str, Any] | None,
) -> Iterator[_Speculation]:
    """The call's state after each step (a round or a plain token) until every slot is finished; ``stats`` is
    filled at the end, or where the call stopped. What the two entry points below share."""
    k = int(num_speculative_tokens)
    if not 1 <= k < engine.verify_width:
        raise InputSpecError(
            f"num_speculative_tokens must be in 1..{engine.verify_width - 1} (the target's verify graph takes "
            f"{engine.verify_width} tokens: rebuild it with a larger --speculative-k for more), got {k}"
        )
    run = _Speculation(engine, draft, input_ids, max_new_tokens, k, attention_mask, sampling, eos_token_id)
    try:
        for _ in run.steps():
            yield run
    finally:
        if stats is not None:
            stats.update(run.stats())


def stream_speculative(
    engine: VerifyEngine,
    draft: StepEngine | FeatureDraft,
    input_ids: np.ndarray,
    max_new_tokens: int,
    num_speculative_tokens: int,
    attention_mask: np.ndarray | None = None,
    sampling: SamplingOptions | None = None,
    eos_token_id: StopIds = None,
    stats: dict[str, Any] | None = None,
) -> Iterator[np.ndarray]:
    """As ``decoding.stream_tokens``: each step's tokens ``[batch]`` (finished slots repeat the id they ended at).

    ``stats`` (if given) is filled with ``proposed`` / ``accepted`` draft tokens, ``rounds`` (verify
    calls), ``draft_calls`` and ``plain_steps`` (target decode steps outside rounds)."""
    args = (max_new_tokens, num_speculative_tokens, attention_mask, sampling, eos_token_id, stats)
    yielded = 0
    for run in _advance(engine, draft, input_ids, *args):
        while yielded < max_new_tokens and (column := _column(run, yielded)) is not None:
            yielded += 1
            yield np.array(column, dtype=np.int64)


def _column(run: _Speculation, index: int) -> list[int] | None:
    """Every slot's token ``index`` once all have one (finished slots: the id they ended at), else None."""
    if all(run.done) and index >= max(len(o) for o in run.out):
        return None  # every sequence ended: no columns of eos only
    column = []
    for row, out in enumerate(run.out):
        if index < len(out):
            column.append(out[index])
        elif run.done[row]:
            column.append(out[-1])
        else:
            return None
    return column


def generate_speculative(
    engine: VerifyEngine,
    draft: StepEngine | FeatureDraft,
    input_ids: np.ndarray,
    max_new_tokens: int,
    num_speculative_tokens: int,
    attention_mask: np.ndarray | None = None,
    sampling: SamplingOptions | None = None,
    eos_token_id: StopIds = None,
    stats: dict[str, Any] | None = None,
) -> np.ndarray:
    """``input_ids`` as given, then the new tokens (``decoding.generate_tokens`` with a draft): what
    ``stream_speculative`` yields, assembled once at the end, not a column per token (a copy of the whole
    batch per token, a large share of the loop's own cost)."""
    ids = np.asarray(input_ids)
    ids = ids[None, :] if ids.ndim == 1 else ids
    args = (max_new_tokens, num_speculative_tokens, attention_mask, sampling, eos_token_id, stats)
    *_, run = _advance(engine, draft, ids, *args)  # the state after the last step
    width = max(len(o) for o in run.out)  # every slot finished: max_new_tokens, or all ended at eos
    new = np.array([o + o[-1:] * (width - len(o)) for o in run.out], dtype=np.int64)  # shorter: ended at eos
    return np.concatenate([ids.astype(np.int64), new], axis=1)
