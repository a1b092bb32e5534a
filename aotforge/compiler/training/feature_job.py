"""``aotforge distill-draft`` as a function: load the teacher, check that its LM head reads the feature the draft
learns, pick the draft's sub-vocabulary, train, and write the feature draft's directory in one rename."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from aotforge.compiler.training.distill import Progress
from aotforge.compiler.training.feature_distill import train_feature_draft
from aotforge.compiler.training.job import check_out, load_teacher
from aotforge.compiler.training.options import FeatureDraftOptions
from aotforge.compiler.training.sub_vocab import frequent_vocab, special_ids
from aotforge.compiler.training.text import token_streams
from aotforge.core.errors import InputSpecError

#: Model families whose base model's ``last_hidden_state`` is exactly what the LM head multiplies (after the final
#: norm; no logit scaling or soft-capping after it), the feature the draft reads from the target.
FEATURE_FAMILIES = ("llama", "qwen2", "gpt2")


def feature_draft_model(
    teacher: Any,
    out: Path,
    *,
    text: tuple[Path, ...] = (),
    options: FeatureDraftOptions = FeatureDraftOptions(),
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Train a feature draft of ``teacher`` (a causal-LM directory, GGUF or ``.py`` file) into ``out``; the report."""
    from aotforge.compiler.training.feature_draft import feature_draft, write_feature_draft

    check_out(out)
    source, tokenizer = load_teacher(teacher)
    model = source.model
    check_features(model)
    streams = token_streams(text, tokenizer, options.held_out_tokens)
    vocab = frequent_vocab(
        streams.train, options.sub_vocab, int(model.config.vocab_size), special_ids(model, tokenizer)
    )
    draft = feature_draft(model, vocab.ids, options.intermediate_size, options.seed)
    report = {"teacher": str(teacher)} | train_feature_draft(model, draft, streams, vocab, options, progress)
    write_feature_draft(out, draft, model.config, str(teacher), report)
    return report


def check_features(model: Any) -> None:
    """Refuse a teacher whose logits are not its LM head applied to its base model's last hidden state."""
    import torch

    family = str(getattr(model.config, "model_type", ""))
    if family not in FEATURE_FAMILIES:
        raise InputSpecError(
            f"a feature draft reads the target's LM-head input, known for {', '.join(FEATURE_FAMILIES)}, not "
            f"{family!r}: distill a token draft instead (aotforge distill --student-layers N)"
        )
    ids = torch.from_numpy(np.arange(8, dtype=np.int64) % int(model.config.vocab_size))[None]
    with torch.no_grad():
        base = getattr(model, model.base_model_prefix)
        hidden = base(input_ids=ids).last_hidden_state
        head = model.get_output_embeddings()
        if head is None or not torch.allclose(head(hidden), model(input_ids=ids).logits, atol=1e-4, rtol=1e-4):
            raise InputSpecError(
                f"{type(model).__name__}'s logits are not its LM head applied to its last hidden state: a feature "
                "draft cannot read its features; distill a token draft instead (aotforge distill --student-layers N)"
            )
