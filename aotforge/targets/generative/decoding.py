"""The decoding loop every generative runner shares: pack prompts, prefill, decode token by token.

A target supplies a :class:`StepEngine` that owns the KV cache of one call (allocated once at its
full size by ``start``, written in place by ``prefill`` and ``decode``). Prompts of different
lengths are packed to the left of their slot (right padding): slot ``b`` holds its own length,
writes its next token there, and stops on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol, TypeAlias

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import InputSpecError
from aotforge.targets.generative.sampling import Sampler, SamplingOptions

#: What ends a sequence: one token id, several (a model may have more than one end-of-sequence id), or none.
StopIds: TypeAlias = int | Iterable[int] | None


def stop_ids(eos_token_id: StopIds) -> frozenset[int]:
    """``eos_token_id`` as the set of ids that end a sequence (empty: every row runs to ``max_new_tokens``)."""
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, int | np.integer):
        return frozenset({int(eos_token_id)})
    return frozenset(int(t) for t in eos_token_id)


class StepEngine(Protocol):
    spec: DecoderSpec

    def start(self, batch: int, prompt_len: int) -> None:
        """Allocate the call's KV cache (``batch`` slots of ``max_seq_len``) and any fixed buffers."""

    def prefill(self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray) -> np.ndarray:
        """Run the prompts (right-padded ``[batch, prompt]``), fill the cache's first positions; last logits."""
        ...

    def decode(self, input_ids: np.ndarray, write_pos: np.ndarray) -> np.ndarray:
        """One token per slot (``[batch, 1]``) written at ``write_pos [batch]`` in place; ``logits [batch, vocab]``."""
        ...


def pack_prompts(input_ids: np.ndarray, attention_mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's real tokens (mask 1, left or right padding alike) moved to the left; ``(ids, lengths)``."""
    ids = np.asarray(input_ids)
    if ids.ndim == 1:
        ids = ids[None, :]
    if ids.ndim != 2 or ids.shape[1] == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise InputSpecError(f"input_ids must be integer token ids [batch, prompt], got {ids.dtype} {ids.shape}")
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask).reshape(ids.shape)
    lengths = mask.astype(bool).sum(axis=1).astype(np.int64)
    if (lengths == 0).any():
        raise InputSpecError("every prompt needs at least one token whose attention_mask is 1")
    packed = np.zeros((ids.shape[0], int(lengths.max())), dtype=np.int64)
    for row, (tokens, keep) in enumerate(zip(ids, mask.astype(bool), strict=True)):
        packed[row, : lengths[row]] = tokens[keep]
    return packed, lengths


def check_fits(spec: DecoderSpec, batch: int, longest: int, max_new_tokens: int) -> None:
    """Refuse, before any work, a call the static cache cannot hold (never a wrong token at its end)."""
    if max_new_tokens < 1:
        raise InputSpecError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if batch > spec.max_batch:
        raise InputSpecError(
            f"batch {batch} is more than the artifact's max_batch {spec.max_batch}: split the batch, "
            "or rebuild with a larger --max-batch"
        )
    # The last new token is only sampled, never written: prompt + max_new_tokens - 1 cache positions.
    if longest + max_new_tokens - 1 > spec.max_seq_len:
        raise InputSpecError(
            f"a prompt of {longest} tokens plus {max_new_tokens} new ones needs {longest + max_new_tokens - 1} "
            f"KV-cache positions, the artifact holds max_seq_len={spec.max_seq_len}: ask for at most "
            f"{spec.max_seq_len - longest + 1} new tokens, or rebuild with a larger --max-seq-len"
        )


def stream_tokens(
    engine: StepEngine,
    input_ids: np.ndarray,
    max_new_tokens: int,
    attention_mask: np.ndarray | None = None,
    sampling: SamplingOptions | None = None,
    eos_token_id: StopIds = None,
) -> Iterator[np.ndarray]:
    """Yield each step's tokens ``[batch]``; a sequence that made one of ``eos_token_id`` (an id or several)
    repeats that id until all are done."""
    packed, lengths = pack_prompts(input_ids, attention_mask)
    batch = packed.shape[0]
    check_fits(engine.spec, batch, int(lengths.max()), max_new_tokens)
    sample = Sampler(sampling or SamplingOptions())
    engine.start(batch, packed.shape[1])
    mask = (np.arange(packed.shape[1])[None, :] < lengths[:, None]).astype(np.int64)
    positions = np.broadcast_to(np.arange(packed.shape[1], dtype=np.int64), packed.shape).copy()
    logits = engine.prefill(packed, mask, positions)
    stop = np.array(sorted(stop_ids(eos_token_id)), dtype=np.int64)
    done = np.zeros(batch, dtype=bool)
    last = np.zeros(batch, dtype=np.int64)
    for step in range(max_new_tokens):
        tokens = np.where(done, last, sample(logits))
        done |= np.isin(tokens, stop)
        last = tokens
        yield tokens
        if done.all() or step == max_new_tokens - 1:
            return
        logits = engine.decode(tokens[:, None], lengths)
        lengths = lengths + 1


def generate_tokens(
    engine: StepEngine,
    input_ids: np.ndarray,
    max_new_tokens: int,
    attention_mask: np.ndarray | None = None,
    sampling: SamplingOptions | None = None,
    eos_token_id: StopIds = None,
) -> np.ndarray:
    """``input_ids`` as given, followed by the new tokens: ``[batch, prompt + new]``."""
    ids = np.asarray(input_ids)
    ids = ids[None, :] if ids.ndim == 1 else ids
    steps = list(stream_tokens(engine, ids, max_new_tokens, attention_mask, sampling, eos_token_id))
    return np.concatenate([ids.astype(np.int64), np.stack(steps, axis=1)], axis=1)
