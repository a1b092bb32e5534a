"""The quality gate of a text-generation build whose passes change numerics (weight-only int4 / int8).

Greedy agreement on random ids says little about a quantized decoder: on a real model int4 agrees on few of the
greedy tokens while its perplexity rises by a few percent. What a user keeps is the next-token distribution
on real text, so both models score the same held-out windows: the fp32 source model in torch over each whole
window, the artifact through its own prefill and decode steps (``targets.generative.perplexity``). The build
records both perplexities and the mean KL(fp32 ‖ artifact) per scored token, and fails when the artifact's
perplexity exceeds the fp32 model's by more than ``max_perplexity_increase`` (relative).

The text: ``--eval-text FILE``, or by default the docstrings of :data:`CORPUS_MODULES` (English prose that
ships with every Python; the manifest records its sha256). It is tokenized with the model's tokenizer when its
directory has one; otherwise each UTF-8 byte is one token id, taken modulo the vocabulary (:func:`byte_ids`).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from aotforge.core.decoder import DecoderSpec
from aotforge.core.errors import InputSpecError, ValidationFailedError
from aotforge.targets.generative.perplexity import log_softmax, window_batches, window_logits

#: Stdlib modules whose docstrings are the default held-out text.
CORPUS_MODULES = ("textwrap", "heapq", "fractions", "string", "difflib", "argparse", "statistics", "calendar")
#: Tokens scored (the first of the text): 2,048, the figure issue 31's measurements use.
EVAL_TOKENS = 2048
#: The longest window: 512 scored tokens each, like ``llama-perplexity -c 512``.
MAX_WINDOW = 513
#: What a user can turn when a build is over budget, each giving up some speed or size for quality.
KNOBS = (
    "8-bit weights (--precision int8), the layers most sensitive to 4 bits at 8 (--pass-opt "
    "weight-only.sensitive_layers_8bit=N), a smaller quantization block (--pass-opt weight-only.block_size=16 on "
    "onnxruntime), the LM head at 8 bits (--pass-opt weight-only.head_bits=8, the text-generation default); "
    "at the same speed: another calibration (--pass-opt weight-only.method=awq+gptq), or training the model for "
    "the target's int4 first (aotforge qat)"
)
BYTE_RULE = "UTF-8 bytes, each byte's value modulo the vocabulary size"


def default_corpus(modules: tuple[str, ...] = CORPUS_MODULES) -> str:
    """The docstrings of ``modules``: each module's, then its classes', functions' and methods'."""
    docs: list[str] = []
    for name in modules:
        module = importlib.import_module(name)
        docs.append(inspect.getdoc(module) or "")
        for _, obj in sorted(vars(module).items()):
            if getattr(obj, "__module__", None) != name or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            docs.append(inspect.getdoc(obj) or "")
            if inspect.isclass(obj):
                docs += [inspect.getdoc(m) or "" for _, m in sorted(vars(obj).items()) if inspect.isfunction(m)]
    return "\n\n".join(d for d in docs if d)


def byte_ids(text: str, vocab: int) -> list[int]:
    """Token ids for a model without a tokenizer: :data:`BYTE_RULE`."""
    return [b % vocab for b in text.encode("utf-8")]


def eval_tokens(text_file: Path | None, tokenizer_dir: Path | None, vocab: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The held-out token ids (at most :data:`EVAL_TOKENS`) and what the manifest says about them."""
    ids, text = text_tokens(text_file, tokenizer_dir, vocab)
    if len(ids) < 2:
        raise InputSpecError(f"--eval-text {text_file}: it gives {len(ids)} tokens; the quality gate needs text")
    return ids[:EVAL_TOKENS], text


def calibration_tokens(text_file: Path | None, tokenizer_dir: Path | None, vocab: int) -> np.ndarray:
    """Token ids to calibrate on, never the ones the gate scores: the text's tokens past :data:`EVAL_TOKENS`, or
    the default corpus's when the text has fewer than :data:`MAX_WINDOW` more."""
    ids = text_tokens(text_file, tokenizer_dir, vocab)[0][EVAL_TOKENS:]
    if len(ids) < MAX_WINDOW and text_file is not None:
        ids = text_tokens(None, tokenizer_dir, vocab)[0][EVAL_TOKENS:]
    return ids


def text_tokens(text_file: Path | None, tokenizer_dir: Path | None, vocab: int) -> tuple[np.ndarray, dict[str, Any]]:
    """Every token id of the text (``--eval-text`` or :func:`default_corpus`) and how it was read."""
    if text_file is None:
        text, corpus = default_corpus(), f"docstrings of the stdlib modules {', '.join(CORPUS_MODULES)}"
    else:
        try:
            text, corpus = Path(text_file).read_text(encoding="utf-8"), str(text_file)
        except (OSError, UnicodeDecodeError) as e:
            raise InputSpecError(f"--eval-text {text_file}: cannot read it as UTF-8 text ({e})") from e
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        ids, rule = list(tokenizer(text)["input_ids"]), "the model's tokenizer"
    else:
        ids, rule = byte_ids(text, vocab), BYTE_RULE
    ids = [i for i in ids if 0 <= i < vocab]
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return np.array(ids, dtype=np.int64), {"corpus": corpus, "text_sha256": digest, "tokenization": rule}


def score(model: Any, runner: Any, tokens: np.ndarray, window: int) -> dict[str, float | int]:
    """Perplexity of the fp32 model and of the artifact on the same windows, and the mean KL between them."""
    import torch

    started = time.perf_counter()
    nll_ref = nll_got = kl = 0.0
    scored = windows = 0
    for batch in window_batches(tokens, window, runner.spec.max_batch):
        with torch.inference_mode():
            ref = torch.log_softmax(model(input_ids=torch.from_numpy(batch)).logits.float(), dim=-1).numpy()
        rows = np.arange(len(batch))
        for pos, logits in window_logits(runner.engine, batch):
            p, q = ref[:, pos - 1].astype(np.float64), log_softmax(logits)
            nll_ref -= float(p[rows, batch[:, pos]].sum())
            nll_got -= float(q[rows, batch[:, pos]].sum())
            kl += float((np.exp(p) * (p - q)).sum())
        scored, windows = scored + batch.size - len(batch), windows + len(batch)
    return {
        "reference_perplexity": round(math.exp(nll_ref / scored), 6),
        "perplexity": round(math.exp(nll_got / scored), 6),
        "mean_kl": round(kl / scored, 6),
        "scored_tokens": scored,
        "window": window,
        "windows": windows,
        "seconds": round(time.perf_counter() - started, 3),
    }


def validate_quality(
    model: Any,
    runner: Any,
    spec: DecoderSpec,
    *,
    text_file: Path | None,
    tokenizer_dir: Path | None,
    max_increase: float,
    name: str,
) -> dict[str, Any]:
    """The manifest's ``validation.quality``; raises when the perplexity increase is above ``max_increase``."""
    tokens, text = eval_tokens(text_file, tokenizer_dir, spec.vocab)
    figures = score(model, runner, tokens, min(spec.max_seq_len + 1, MAX_WINDOW))
    increase = figures["perplexity"] / figures["reference_perplexity"] - 1
    record = {**text, **figures, "perplexity_increase": round(increase, 6), "max_perplexity_increase": max_increase}
    if increase > max_increase:
        raise ValidationFailedError(
            f"{name}: held-out perplexity {figures['perplexity']:.4f} is {increase:+.1%} over the fp32 model's "
            f"{figures['reference_perplexity']:.4f} (mean KL {figures['mean_kl']:.4g} nats per token, "
            f"{figures['scored_tokens']} tokens of {text['corpus']}): above the quality budget "
            f"--max-perplexity-increase {max_increase:g}. Trade speed for quality: {KNOBS}; "
            "or allow more with --max-perplexity-increase"
        )
    return record
