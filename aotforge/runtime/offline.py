"""``generate()`` and ``stream()`` of a loaded text-generation artifact, as clients of the serving engine.

Each row of the batch is one request to an :class:`LLMEngine` over the target's model runner (a cache of as many
slots as the batch has rows), so offline and served generation run the same prefill, decode and sampling code.
The call keeps today's contract: prompts packed from an attention mask, refusals before any work (the static
cache's limits), one random generator for the whole call drawn row after row (so a seeded call repeats
exactly), and rows that stopped at one of ``eos_token_id`` (an id or several) repeating it until every row is
done. Which ids those are by default (the model's own) the loaded artifact decides (``artifacts/loader.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from aotforge.core.errors import RunnerError
from aotforge.runtime.engine import LLMEngine
from aotforge.runtime.outputs import FinishReason
from aotforge.runtime.params import EngineConfig, SamplingParams
from aotforge.targets.generative.decoding import StopIds, check_fits, pack_prompts, stop_ids
from aotforge.targets.generative.sampling import Sampler, SamplingOptions

#: ``generate`` / ``stream`` keywords that choose how tokens are sampled (``GenerativeRunner.generate``'s names).
_SAMPLING = ("do_sample", "temperature", "top_k", "top_p", "seed")


def on_engine(model: Any, kwargs: dict[str, Any]) -> bool:
    """Whether this call runs on the engine. Speculative decoding (a draft) stays on the step engine: the runtime
    has no draft model or verify step yet. So do targets whose step engine has no model runner (tensorrt,
    neuron: their runners are written for a device host)."""
    return kwargs.get("draft") is None and hasattr(model.engine, "model_runner")


def stream(model: Any, input_ids: np.ndarray, max_new_tokens: int, **kwargs: Any) -> Iterator[np.ndarray]:
    """Each step's new tokens ``[batch]`` (``model``: the target's ``GenerativeRunner``)."""
    if not on_engine(model, kwargs):
        return model.stream(input_ids, max_new_tokens, **kwargs)
    return _columns(model, input_ids, max_new_tokens, **kwargs)


def generate(model: Any, input_ids: np.ndarray, max_new_tokens: int, **kwargs: Any) -> np.ndarray:
    """``input_ids`` as given, then the new tokens: ``[batch, prompt + new]``."""
    if not on_engine(model, kwargs):
        return model.generate(input_ids, max_new_tokens, **kwargs)
    ids = np.asarray(input_ids)
    ids = ids[None, :] if ids.ndim == 1 else ids
    steps = list(_columns(model, ids, max_new_tokens, **kwargs))
    return np.concatenate([ids.astype(np.int64), np.stack(steps, axis=1)], axis=1)


def _columns(
    model: Any,
    input_ids: np.ndarray,
    max_new_tokens: int,
    attention_mask: np.ndarray | None = None,
    eos_token_id: StopIds = None,
    draft: None = None,
    num_speculative_tokens: int | None = None,
    **sampling: Any,
) -> Iterator[np.ndarray]:
    packed, lengths = pack_prompts(input_ids, attention_mask)
    batch = len(lengths)
    check_fits(model.spec, batch, int(lengths.max()), max_new_tokens)  # before any work, as the step engine did
    unknown = set(sampling) - set(_SAMPLING)
    if unknown:
        raise TypeError(f"generate() got unexpected keyword arguments {sorted(unknown)}")
    sampler = Sampler(SamplingOptions(**sampling))
    engine = _engine(model, batch, int(lengths.sum()), sampler.options.do_sample)
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0)  # the call's sampler draws; eos: _advance
    for row, (prompt, n) in enumerate(zip(packed.tolist(), lengths.tolist(), strict=True)):
        engine.add_request(str(row), prompt[:n], params, sampler=sampler)
    return _advance(engine, batch, stop_ids(eos_token_id))


def _engine(model: Any, batch: int, prompt_tokens: int, sampled: bool) -> LLMEngine:
    """An engine for one call: a slot per row, every prompt prefilled whole in the first step (the budget holds
    them all), no prefix reuse (each call starts from nothing, as the step engine's did). A sampled call steps one
    batch at a time: its one generator draws row after row, which batches in flight would reorder."""
    config = EngineConfig(
        max_num_seqs=batch,
        max_num_batched_tokens=max(prompt_tokens, 1),
        enable_prefix_caching=False,
        max_batches_in_flight=1 if sampled else 0,
    )
    return LLMEngine(model.model_runner(batch), config)


def _advance(engine: LLMEngine, batch: int, stop: frozenset[int]) -> Iterator[np.ndarray]:
    """Step the engine; after each step, the column of every row's newest token. A row that has made one of
    ``stop`` repeats it, and the engine keeps decoding it until every row has (as the step engine does: so a
    sampled call draws from its one generator exactly what it drew before)."""
    rows: list[list[int]] = [[] for _ in range(batch)]
    stopped = [False] * batch
    column = [0] * batch
    made = 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finish_reason is FinishReason.ERROR:
                _abort_all(engine, batch)
                raise RunnerError(out.error or "the model runner failed")
            rows[int(out.request_id)] += out.token_ids
        while all(len(r) > made for r in rows):
            column = [last if done else r[made] for r, done, last in zip(rows, stopped, column, strict=True)]
            stopped = [done or t in stop for done, t in zip(stopped, column, strict=True)]
            yield np.array(column, dtype=np.int64)
            made += 1
            if all(stopped):
                _abort_all(engine, batch)
                return


def _abort_all(engine: LLMEngine, batch: int) -> None:
    for row in range(batch):
        engine.abort(str(row))
