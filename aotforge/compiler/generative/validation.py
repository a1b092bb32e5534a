"""Validation of a generative artifact: greedy tokens, token for token, against transformers.

The reference is the source model's own eager loop with its KV cache (what transformers' greedy
``generate`` does, without its stopping rules). The artifact decodes the prompts once as a batch
through ``generate`` (the path users call: packing, per-slot positions) and once teacher-forced on
the reference tokens, prompt by prompt, to record each step's logits relative L2.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import ValidationFailedError
from aotforge.runtime import offline

PROMPT_LENGTHS = (5, 11, 17)
NEW_TOKENS = 24


def validation_prompts(spec: DecoderSpec, seed: int) -> tuple[list[np.ndarray], int]:
    """Prompts of a few lengths (random ids, drawn with ``seed``) and how many tokens to decode."""
    rng = np.random.default_rng(seed)
    lengths = [n for n in PROMPT_LENGTHS if n < spec.max_seq_len // 2] or [max(1, spec.max_seq_len // 4)]
    new = min(NEW_TOKENS, spec.max_seq_len - max(lengths) + 1)
    return [rng.integers(0, spec.vocab, size=n, dtype=np.int64) for n in lengths], new


def reference_greedy(model: Any, prompt: np.ndarray, new_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """transformers' greedy decoding with its cache: the tokens and each step's logits."""
    import torch

    tokens, logits, cache = [], [], None
    ids = torch.from_numpy(prompt[None, :])
    with torch.inference_mode():
        for _ in range(new_tokens):
            out = model(input_ids=ids, cache=cache, use_cache=True)
            cache = out.cache
            step = out.logits[0, -1].float().numpy()
            logits.append(step)
            tokens.append(int(step.argmax()))
            ids = torch.tensor([[tokens[-1]]])
    return tokens, logits


def forced_logits(runner: Any, prompt: np.ndarray, tokens: list[int]) -> list[np.ndarray]:
    """The artifact's logits at each step when fed the reference tokens (one slot)."""
    engine = runner.engine
    engine.start(1, len(prompt))
    ids = prompt[None, :]
    out = [engine.prefill(ids, np.ones_like(ids), np.arange(len(prompt), dtype=np.int64)[None, :]).copy()[0]]
    for step, token in enumerate(tokens[:-1]):
        write = np.array([len(prompt) + step], dtype=np.int64)
        out.append(engine.decode(np.array([[token]], dtype=np.int64), write).copy()[0])
    return out


def validate_generation(
    model: Any,
    runner: Any,
    spec: DecoderSpec,
    *,
    seed: int,
    tolerance: float,
    min_agreement: float,
    name: str,
    gate: bool = True,
) -> dict[str, Any]:
    """The manifest's validation record; raises if tokens or logits leave the tolerance (``gate``; a build whose
    passes change numerics only reports them: ``compiler.generative.quality`` gates it)."""
    prompts, new = validation_prompts(spec, seed)
    references = [reference_greedy(model, p, new) for p in prompts]
    return check_generation(
        prompts,
        references,
        runner,
        spec,
        seed=seed,
        tolerance=tolerance,
        min_agreement=min_agreement,
        name=name,
        gate=gate,
    )


def check_generation(
    prompts: list[np.ndarray],
    references: list[tuple[list[int], list[np.ndarray]]],
    runner: Any,
    spec: DecoderSpec,
    *,
    seed: int,
    tolerance: float,
    min_agreement: float,
    name: str,
    gate: bool = True,
) -> dict[str, Any]:
    """:func:`validate_generation` against references computed elsewhere (a bundle carries them to the device
    host, which lacks the source model): ``references[i]`` is ``(tokens, per-step logits)`` of ``prompts[i]``."""
    new = len(references[0][0])
    got = _batched_generate(runner, prompts, new, spec.max_batch)
    per_prompt: list[dict[str, Any]] = []
    worst = 0.0
    for prompt, (ref_tokens, ref_logits), tokens in zip(prompts, references, got, strict=True):
        rel = [_rel_l2(a, b) for a, b in zip(forced_logits(runner, prompt, ref_tokens), ref_logits, strict=True)]
        same = _common_prefix(tokens, ref_tokens)
        worst = max(worst, max(rel))
        per_prompt.append(
            {"prompt_len": int(len(prompt)), "matched": same, "exact": same == new, "logits_rel_l2": _round(rel)}
        )
    agreement = sum(p["matched"] for p in per_prompt) / (new * len(prompts))
    record = {
        "reference": "transformers eager greedy decoding with its KV cache (fp32)",
        "metric": "token agreement (matching prefix) and per-step logits rel_l2",
        "new_tokens": new,
        "seed": seed,
        "tolerance": tolerance,
        "min_token_agreement": min_agreement,
        "token_agreement": round(agreement, 6),
        "max_logits_rel_l2": float(f"{worst:.3g}"),
        "prompts": per_prompt,
    }
    if not gate:
        ungated = ("tolerance", "min_token_agreement")  # reported, not applied
        return {**{k: v for k, v in record.items() if k not in ungated}, "gated": False}
    if agreement < min_agreement or worst > tolerance:
        raise ValidationFailedError(
            f"{name}: greedy generation agrees with transformers on {agreement:.1%} of {new * len(prompts)} tokens "
            f"(at least {min_agreement:.1%} required), worst per-step logits rel L2 {worst:.3g} (tolerance "
            f"{tolerance:g}): the target miscompiles the decoder; drop the pass that changes numerics or report it"
        )
    return {**record, "passed": True}


def _batched_generate(runner: Any, prompts: list[np.ndarray], new: int, max_batch: int) -> list[list[int]]:
    """Every prompt through ``generate``, left-padded into batches of at most ``max_batch``."""
    out: list[list[int]] = []
    for start in range(0, len(prompts), max_batch):
        group = prompts[start : start + max_batch]
        width = max(len(p) for p in group)
        ids = np.zeros((len(group), width), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, prompt in enumerate(group):
            ids[row, width - len(prompt) :], mask[row, width - len(prompt) :] = prompt, 1
        result = offline.generate(runner, ids, new, attention_mask=mask)  # the path load(path).generate() takes
        out.extend(result[:, width:].tolist())
    return out


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-30))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _round(values: list[float]) -> list[float]:
    return [float(f"{v:.3g}") for v in values]
