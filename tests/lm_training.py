"""How the trained pair of ``tests/lm_pair.py`` is trained: the recipe (its hash keys the pair's cache) and the
training loop, next-byte prediction for the target, distillation from the target's logits for the draft."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tests.lm_bytes import BOS, EOS, PAD, VOCAB

#: Everything that decides the weights; its hash (with the text and library versions) keys the cache.
RECIPE: dict[str, Any] = {
    "version": 3,
    "seed": 0,
    # One thread: on a shared 2-core machine two OpenMP threads spin at every barrier while the other is
    # descheduled (a 500-step run took over 40 min under load 12); one thread took 260 ms a step at load 4.
    "threads": 1,
    "seq_len": 256,
    "batch": 16,
    "lr": 3e-3,
    "warmup": 30,
    "weight_decay": 0.01,
    "target": {
        "hidden_size": 128,
        "intermediate_size": 384,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
        "steps": 400,
    },
    "draft": {
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "tie_word_embeddings": True,
        "steps": 300,
        # The loss: KL(target || draft) over the target's next-byte distribution on each batch (1.0), none of
        # the cross-entropy on the bytes. Measured on 4 held-out prompts x 96 bytes, greedy: acceptance at
        # k=3 / 4 72% / 66% trained on the bytes (perplexity 7.54), 73% / - half and half (7.06), 77% / 71%
        # distilled alone (7.20).
        "distill": 1.0,
    },
}


def llama_config(role: str) -> Any:
    import transformers as tf

    shape = {k: v for k, v in RECIPE[role].items() if k not in ("steps", "distill")}
    return tf.LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=512,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        **shape,
    )


def train_model(role: str, train_text: str, progress: Callable[[str], None] | None = None, teacher: Any = None) -> Any:
    """One model trained from scratch (AdamW, warmup then cosine decay) on next-byte prediction, or, with
    the role's ``distill`` weight and a ``teacher``, partly or wholly on the teacher's next-byte distribution."""
    import numpy as np
    import torch
    import transformers as tf

    threads = torch.get_num_threads()
    torch.set_num_threads(RECIPE["threads"])
    try:
        torch.manual_seed(RECIPE["seed"])
        model = tf.LlamaForCausalLM(llama_config(role)).train()
        data = torch.tensor(np.frombuffer(train_text.encode("utf-8"), dtype=np.uint8).astype(np.int64))
        rng = np.random.default_rng(RECIPE["seed"])
        steps, seq, batch = RECIPE[role]["steps"], RECIPE["seq_len"], RECIPE["batch"]
        optim = torch.optim.AdamW(model.parameters(), lr=RECIPE["lr"], weight_decay=RECIPE["weight_decay"])
        warmup, distill = RECIPE["warmup"], float(RECIPE[role].get("distill", 0.0)) if teacher is not None else 0.0
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optim,
            lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)),
        )
        for step in range(steps):
            if progress is not None and step % 50 == 0:
                progress(f"{role}: step {step}/{steps}")
            starts = rng.integers(0, len(data) - seq - 1, size=batch)
            ids = torch.stack([data[s : s + seq] for s in starts])
            with torch.autocast("cpu", dtype=torch.bfloat16):  # AMX / AVX512-BF16 matmuls: ~8x fp32 here
                loss = (
                    model(input_ids=ids, labels=ids).loss
                    if not distill
                    else _distill_loss(model, teacher, ids, distill)
                )
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            schedule.step()
        return model.eval()
    finally:
        torch.set_num_threads(threads)


def _distill_loss(model: Any, teacher: Any, ids: Any, weight: float) -> Any:
    """``weight`` x KL(teacher || model) of the next-byte distributions + (1 - ``weight``) x the cross-entropy
    on the bytes themselves."""
    import torch

    with torch.inference_mode():
        target = torch.log_softmax(teacher(input_ids=ids).logits[:, :-1].float(), -1).flatten(0, 1)
    logq = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1).flatten(0, 1)
    kl = torch.nn.functional.kl_div(logq, target.clone(), log_target=True, reduction="batchmean")
    return weight * kl + (1 - weight) * torch.nn.functional.nll_loss(logq, ids[:, 1:].flatten())
