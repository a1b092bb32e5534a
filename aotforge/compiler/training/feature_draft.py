"""The feature draft (``/work/notes/feature_draft_spec.md``; EAGLE, Li et al. 2024; Hydra, Ankner et al. 2024) in
torch, for training: one attention-free step maps the target's LM-head input ``h`` and the token after it to the
next ``h`` and a proposal over a sub-vocabulary; and its directory (``feature_draft.json`` + ``weights.safetensors``)
as the runtime reads it."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from aotforge.core.errors import InputSpecError


def rms_eps(config: Any) -> float:
    """The teacher's normalization epsilon (``rms_norm_eps`` / GPT-2's ``layer_norm_epsilon``)."""
    for key in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"):
        if getattr(config, key, None) is not None:
            return float(getattr(config, key))
    return 1e-6


def feature_draft(teacher: Any, vocab_ids: np.ndarray, intermediate_size: int, seed: int = 0) -> Any:
    """A :class:`FeatureDraft` for ``teacher``: its input embedding copied (frozen), the head its LM-head rows
    ``vocab_ids``; ``z`` starts as ``h`` and the MLP's output at 0, so step one's proposal starts as the teacher's
    own reading of ``h``, and training only has to learn the step from ``h_t`` to ``h_{t+1}``."""

    config = teacher.config
    d, full = int(config.hidden_size), int(config.vocab_size)
    if not 0 < len(vocab_ids) <= full or int(np.max(vocab_ids)) >= full:
        raise InputSpecError(
            f"the draft's sub-vocabulary of {len(vocab_ids)} tokens does not fit the teacher's vocabulary of {full}"
        )
    embed = teacher.get_input_embeddings().weight
    head = teacher.get_output_embeddings()
    if tuple(embed.shape) != (full, d) or head is None or tuple(head.weight.shape) != (full, d):
        raise InputSpecError(
            f"{type(teacher).__name__}: a feature draft needs an input embedding and an LM head of [{full}, {d}] "
            f"(the target's vocabulary by its hidden size); this teacher has {tuple(embed.shape)}"
        )
    if getattr(head, "bias", None) is not None:
        raise InputSpecError(f"{type(teacher).__name__}'s LM head has a bias, which the feature draft's head lacks")
    torch.manual_seed(seed)
    draft = FeatureDraft(full, d, intermediate_size or 2 * d, len(vocab_ids), rms_eps(config))
    with torch.no_grad():
        draft.embed.copy_(embed.detach().float())
        draft.head.copy_(head.weight.detach().float()[torch.from_numpy(np.asarray(vocab_ids, dtype=np.int64))])
        draft.fc.zero_()
        draft.fc[:, d:].copy_(torch.eye(d))
        draft.fc[:, :d].normal_(0.0, 0.02)
    draft.vocab_ids.copy_(torch.from_numpy(np.asarray(vocab_ids, dtype=np.int64)))
    return draft


class FeatureDraft(torch.nn.Module):
    """The spec's forward, its parameters by the spec's names (``embed`` frozen: the target's own)."""

    vocab_ids: torch.Tensor

    def __init__(self, vocab: int, d: int, f: int, n: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.embed = torch.nn.Parameter(torch.zeros(vocab, d), requires_grad=False)
        self.fc = torch.nn.Parameter(torch.zeros(d, 2 * d))
        self.fc_bias = torch.nn.Parameter(torch.zeros(d))
        self.norm = torch.nn.Parameter(torch.ones(d))
        self.gate = torch.nn.Parameter(torch.randn(f, d) * d**-0.5)
        self.up = torch.nn.Parameter(torch.randn(f, d) * d**-0.5)
        self.down = torch.nn.Parameter(torch.zeros(d, f))
        self.head = torch.nn.Parameter(torch.zeros(n, d))
        self.register_buffer("vocab_ids", torch.zeros(n, dtype=torch.int64))

    def step(self, h: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        """``(h [..., d], tok [...] target ids)`` -> ``y [..., d]``, the predicted next feature."""
        z = F.linear(torch.cat([self.embed[tok].to(h.dtype), h], -1), self.fc, self.fc_bias)
        r = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm
        return z + F.linear(F.silu(F.linear(r, self.gate)) * F.linear(r, self.up), self.down)

    def logits(self, y: torch.Tensor) -> torch.Tensor:
        """``y [..., d]`` -> logits over the sub-vocabulary, ``[..., n]``."""
        return F.linear(y, self.head)

    def propose(self, y: torch.Tensor) -> torch.Tensor:
        """The target id of ``y``'s greedy proposal."""
        return self.vocab_ids[self.logits(y).argmax(-1)]


def write_feature_draft(out: Path, draft: Any, teacher_config: Any, name_or_path: str, report: dict[str, Any]) -> None:
    """``draft`` as the runtime's directory at ``out`` (``save_feature_draft``), staged and moved in one rename."""
    from aotforge.targets.generative.feature_draft import save_feature_draft

    state = {k: v.detach().float().contiguous().numpy() for k, v in draft.named_parameters()}
    state["vocab_ids"] = draft.vocab_ids.detach().numpy().astype(np.int64)
    target = {
        "model_type": str(teacher_config.model_type),
        "hidden_size": int(teacher_config.hidden_size),
        "vocab_size": int(teacher_config.vocab_size),
        "name_or_path": name_or_path,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as tmp:
        staged = save_feature_draft(
            Path(tmp) / "draft", state, rms_eps=float(draft.eps), target=target, training=report
        )
        if out.exists():
            out.rmdir()  # empty (checked before training): the rename takes its place
        staged.rename(out)
