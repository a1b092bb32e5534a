"""How the trained pair of ``tests/lm_pair.py`` is trained: the recipe (its hash keys the pair's cache) and the
training loop, next-byte prediction for the target, distillation from the target's logits for the draft."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tests.lm_bytes import BOS, EOS, PAD, VOCAB

#: Everything that decides the weights; its hash (with the text and library versions) keys the cache.
RECIPE: dict[str, Any] = {
    "version": 4,
    "seed": 0,
    # Two threads: the target's matmuls are wide enough now (256) that the second core pays (408 against 747 ms
    # a step at load 1, AMD EPYC). A loaded machine stretches the wall time, not the weights.
    "threads": 2,
    "seq_len": 256,
    "batch": 16,
    "warmup": 30,
    "weight_decay": 0.01,
    # Wide enough that a decode step reads its weights (3.3 M parameters, 13 MB in fp32: past a core's L2),
    # as a real target's does; speculative decoding saves exactly those reads. At 4 x 128 (0.86 M) a step was
    # per-node overhead, the draft's step cost a third of the target's and 1.27x was the bound on the AMD host.
    "target": {
        "hidden_size": 256,
        "intermediate_size": 768,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
        "steps": 300,
        # Held-out perplexity after 300 steps: 5.87 at 1.5e-3, 7.54 at 3e-3, 8.87 at 6e-3.
        "lr": 1.5e-3,
    },
    "draft": {
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "tie_word_embeddings": True,
        # Trained alongside the target over its last `steps` steps, on the same batches, on KL(target || draft)
        # of the next-byte distributions, the target's logits of that very step as the teacher's: no second
        # forward pass of the target (which took 40 of the 59 s a separate distillation took at width 256).
        "steps": 240,
        # Perplexity 8.41 at 6e-3 (greedy acceptance, 4 held-out prompts x 96 bytes: 85% / 79% at k=3 / 4), 10.0
        # at the target's 1.5e-3 (81% / 78%). Distilled after the target, from a second forward pass of it, the
        # draft of a 3e-3 target reached 8.15 against 9.45 alongside, for 40 s more.
        "lr": 6e-3,
    },
}


def llama_config(role: str) -> Any:
    import transformers as tf

    shape = {k: v for k, v in RECIPE[role].items() if k not in ("steps", "lr")}
    return tf.LlamaConfig(
        vocab_size=VOCAB,
        max_position_embeddings=512,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        **shape,
    )


def train_pair(train_text: str, progress: Callable[[str], None] | None = None) -> tuple[Any, Any]:
    """``(target, draft)`` trained from scratch in one loop (AdamW, warmup then cosine decay each): the target on
    next-byte prediction, the draft, over the target's last steps, on the target's next-byte distribution."""
    import numpy as np
    import torch
    import transformers as tf

    threads = torch.get_num_threads()
    torch.set_num_threads(RECIPE["threads"])
    try:
        torch.manual_seed(RECIPE["seed"])
        target = tf.LlamaForCausalLM(llama_config("target")).train()
        draft = tf.LlamaForCausalLM(llama_config("draft")).train()
        data = torch.tensor(np.frombuffer(train_text.encode("utf-8"), dtype=np.uint8).astype(np.int64))
        rng = np.random.default_rng(RECIPE["seed"])
        steps, seq, batch = RECIPE["target"]["steps"], RECIPE["seq_len"], RECIPE["batch"]
        first_draft_step = steps - RECIPE["draft"]["steps"]
        target_opt, target_lr = _optimizer(target, "target")
        draft_opt, draft_lr = _optimizer(draft, "draft")
        for step in range(steps):
            if progress is not None and step % 50 == 0:
                progress(f"step {step}/{steps}")
            starts = rng.integers(0, len(data) - seq - 1, size=batch)
            ids = torch.stack([data[s : s + seq] for s in starts])
            with torch.autocast("cpu", dtype=torch.bfloat16):  # AMX / AVX512-BF16 matmuls: ~8x fp32 here
                out = target(input_ids=ids, labels=ids)
            _step(out.loss, target, target_opt, target_lr)
            if step >= first_draft_step:
                teacher = torch.log_softmax(out.logits.detach()[:, :-1].float(), -1).flatten(0, 1)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logits = draft(input_ids=ids).logits[:, :-1]
                logq = torch.log_softmax(logits.float(), -1).flatten(0, 1)
                kl = torch.nn.functional.kl_div(logq, teacher, log_target=True, reduction="batchmean")
                _step(kl, draft, draft_opt, draft_lr)
        return target.eval(), draft.eval()
    finally:
        torch.set_num_threads(threads)


def _optimizer(model: Any, role: str) -> tuple[Any, Any]:
    import torch

    optim = torch.optim.AdamW(model.parameters(), lr=RECIPE[role]["lr"], weight_decay=RECIPE["weight_decay"])
    warmup, steps = RECIPE["warmup"], RECIPE[role]["steps"]
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    return optim, schedule


def _step(loss: Any, model: Any, optim: Any, schedule: Any) -> None:
    import torch

    optim.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optim.step()
    schedule.step()
