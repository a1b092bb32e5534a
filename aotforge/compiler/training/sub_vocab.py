"""A draft's reduced vocabulary (``aotforge distill --draft-vocab N``): the ``N`` tokens most frequent in the training
text (special tokens always in), and the student cut to them (its embedding and LM head rows of those tokens).
The map it writes beside the weights is what the runtime reads (``targets/generative/draft_vocab.py``)."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from aotforge.core.errors import InputSpecError
from aotforge.targets.generative.draft_vocab import DraftVocab


def frequent_vocab(train: np.ndarray, size: int, full_vocab: int, keep: list[int]) -> DraftVocab:
    """The ``size`` tokens of ``train`` seen most often (ties: the lower id), ``keep`` first; the least frequent
    of them is what every other token reads as (its embedding learns "some rarer token")."""
    if not len(keep) < size < full_vocab:
        raise InputSpecError(f"--draft-vocab {size}: give more than {len(keep)} and fewer than {full_vocab} tokens")
    counts = np.bincount(train, minlength=full_vocab).astype(np.int64)
    counts[keep] = -1  # placed first below, not twice
    order = np.argsort(-counts, kind="stable")
    ids = np.concatenate([np.asarray(sorted(set(keep)), dtype=np.int64), order[: size - len(set(keep))]])
    return DraftVocab(ids.astype(np.int64), size - 1)


def special_ids(model: Any, tokenizer: Any) -> list[int]:
    """The token ids a draft must be able to read and propose: the tokenizer's special tokens (end of text, ...)."""
    ids = set(tokenizer.all_special_ids)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(model.config, key, None)
        ids |= set(value) if isinstance(value, list) else {value} if value is not None else set()
    return sorted(i for i in ids if 0 <= i < int(model.config.vocab_size))


def restrict_vocab(model: Any, vocab: DraftVocab) -> Any:
    """``model`` with a vocabulary of ``vocab.ids``' tokens: every tensor over the vocabulary (embedding, head, its
    bias) cut to their rows; the config's special token ids moved to their draft ids."""
    full = int(model.config.vocab_size)
    config = copy.deepcopy(model.config)
    config.vocab_size = len(vocab.ids)
    table = vocab.to_draft(full)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, key, None)
        if isinstance(value, list):
            setattr(config, key, [int(table[v]) for v in value])
        elif value is not None:
            setattr(config, key, int(table[value]))
    cut = type(model)(config)
    rows = vocab.ids.tolist()
    state = {k: (v[rows] if v.shape[:1] == (full,) else v).detach().clone() for k, v in model.state_dict().items()}
    cut.load_state_dict(state, strict=True)
    return cut
