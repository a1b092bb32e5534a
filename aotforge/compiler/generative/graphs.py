"""The two graphs of a decoder, as torch modules around a transformers causal LM.

* :class:`Prefill` — ``input_ids [batch, prompt]``, ``attention_mask [batch, prompt]`` (1 for a
  real token; prompts right-padded), ``position_ids [batch, prompt]`` -> ``logits [batch, vocab]``
  at each sequence's last real token and ``present_{key,value}_<layer> [batch, kv_heads, prompt, head_dim]``.
* :class:`Decode` — one token per slot: ``input_ids [batch, 1]``, ``position_ids [batch, 1]``,
  ``write_pos [batch]`` (the cache slot each sequence writes, its own length so far) and
  ``past_{key,value}_<layer> [batch, kv_heads, max_seq_len, head_dim]`` -> ``logits [batch, vocab]`` and
  ``present_{key,value}_<layer>``: the same cache with the new token scattered in at ``write_pos``.
  A runtime binds ``past_*`` and ``present_*`` to one buffer, so the update happens in place.

``Prefill(..., hidden=True)`` and ``Verify(..., hidden=True)`` (a build with ``--speculative-k``) also return,
last, ``hidden``: the LM head's input (after the final norm) at the positions they return logits for, ``[batch, d]``
and ``[batch, steps, d]``; a feature draft (``targets/generative/feature_draft``) proposes from it.

Both run the model's own layers (RoPE, RMSNorm, GQA, Conv1D ... whatever the architecture has);
only the cache and the mask are ours: a :class:`transformers.Cache` whose layers scatter into the
static buffers, and a ready 4D additive mask (transformers uses a 4D mask as given). A sliding window
shorter than the cache is a banded mask of ours too: one for every layer (Mistral), or one per layer type
(``{"full_attention": ..., "sliding_attention": ...}``, what Gemma 2 / 3, Qwen2, Cohere 2 take as given).

``Decode(model, fused_attention=True)`` is the same graph for a runtime that has a fused
attention with an in-place slot cache (onnxruntime's GroupQueryAttention, ``slot_attention``):
the cache layers pass the new keys/values through, and each layer's attention writes and reads the
cache itself, over each slot's filled length only. Inputs and outputs are the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from aotforge.core.decoder import sliding_windows
from aotforge.core.errors import UnsupportedModelError
from aotforge.targets.onnxruntime import slot_attention


class _SlotLayer(CacheLayerMixin):
    """One layer of the static cache: the new keys/values go to ``write_pos`` of each slot."""

    is_sliding = False

    def __init__(
        self,
        keys: torch.Tensor | None,
        values: torch.Tensor | None,
        write_pos: torch.Tensor | None,
        fused: bool = False,
        steps: Any = 1,
    ) -> None:
        super().__init__()
        self.keys, self.values, self.write_pos = keys, values, write_pos
        self.steps = steps  # query tokens per slot: 1 (decode) or the verify graph's width
        self.is_initialized = keys is not None
        self.fused = fused  # the attention writes this step's keys/values (slot_attention)
        self.prompt_mask: torch.Tensor | None = None  # prefill, fused: the attention_mask input (its shape)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.keys is None or self.values is None or self.write_pos is None:
            # Prefill: the prompt's keys/values are the whole context; the runtime copies them into the cache.
            self.keys, self.values = key_states, value_states
            return key_states, value_states
        if self.fused:
            return key_states, value_states
        # One token per slot, each at its own position: ScatterElements on the sequence axis.
        if isinstance(self.steps, int) and self.steps == 1:
            index = self.write_pos.view(-1, 1, 1, 1).expand(-1, key_states.shape[1], 1, key_states.shape[3])
        else:  # verify: `steps` tokens per slot at write_pos, write_pos + 1, ...
            at = self.write_pos[:, None] + torch.arange(key_states.shape[2])[None, :]
            index = at[:, None, :, None].expand(-1, key_states.shape[1], -1, key_states.shape[3])
        self.keys = self.keys.scatter(2, index, key_states)
        self.values = self.values.scatter(2, index, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return (query_length if self.keys is None else self.keys.shape[-2]), 0

    def get_seq_length(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[-2])

    def get_max_length(self) -> int:
        return -1 if self.keys is None else int(self.keys.shape[-2])


class _SlotCache(Cache):
    def __init__(self, layers: list[_SlotLayer]) -> None:
        super().__init__(layers=list(layers))


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean ``[batch, 1, q, k]`` mask as the additive float mask eager attention adds to its scores."""
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.tensor(torch.finfo(dtype).min, dtype=dtype))


def _masks(allowed: torch.Tensor, distance: torch.Tensor, windows: dict[str, int], dtype: torch.dtype) -> Any:
    """The additive mask(s) the layers take: ``allowed [batch, 1, q, k]`` as it is, and for each sliding layer type
    also no key ``window`` or more positions behind its query (``distance [.., q, k]``: query minus key index),
    as transformers' ``sliding_window_overlay`` masks them."""
    full = _additive(allowed, dtype)
    if not windows:
        return full
    banded = {kind: _additive(allowed & (distance < window), dtype) for kind, window in windows.items()}
    return banded[""] if "" in banded else {"full_attention": full, **banded}


def num_layers(model: Any) -> int:
    return int(model.config.num_hidden_layers)


def _head(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """The logits as the causal LM's own ``forward`` makes them: its head, then what some families do to the
    head's output there rather than in a module (Granite divides by ``logits_scaling``, Cohere multiplies by
    ``logit_scale``, Gemma 2 / 3 soft-cap by ``final_logit_softcapping``); ``head_scaling`` reads which."""
    logits = model.get_output_embeddings()(hidden)
    divide, multiply, cap = head_scaling(model.config)
    if divide != 1.0:
        logits = logits / divide
    if multiply != 1.0:
        logits = logits * multiply
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def head_scaling(config: Any) -> tuple[float, float, float]:
    """``(divide by, multiply by, soft-cap)`` of the logits after the head in the ``forward`` of the family
    ``config`` is of (``1.0, 1.0, 0.0``: none). Keyed by family, not by attribute name alone: HyperCLOVA X
    multiplies by the ``logits_scaling`` that Granite divides by."""
    family = str(getattr(config, "model_type", ""))
    divide = float(getattr(config, "logits_scaling", 1.0) or 1.0) if family.startswith("granite") else 1.0
    multiply = float(getattr(config, "logit_scale", 1.0) or 1.0) if family.startswith("cohere") else 1.0
    return divide, multiply, float(getattr(config, "final_logit_softcapping", None) or 0.0)


class Prefill(torch.nn.Module):
    """The prompt pass (see the module docstring); ``fused_attention``: each layer's attention one
    GroupQueryAttention over the prompt (``slot_attention.prompt_gqa``), same inputs and outputs. ``max_seq_len``:
    the cache the prompts go to, so that a sliding window no shorter than it is no mask of its own."""

    def __init__(
        self, model: Any, fused_attention: bool = False, max_seq_len: int | None = None, hidden: bool = False
    ) -> None:
        super().__init__()
        self.model = model
        self.fused_attention = fused_attention
        self.windows = sliding_windows(model.config, max_seq_len)
        self.hidden = hidden

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> Any:
        steps = input_ids.shape[1]
        causal = torch.ones(steps, steps, dtype=torch.bool).tril()
        allowed = causal[None, None] & attention_mask.bool()[:, None, None, :]
        at = torch.arange(steps)
        distance = (at[:, None] - at[None, :])[None, None]
        layers = [_SlotLayer(None, None, None) for _ in range(num_layers(self.model))]
        for layer in layers:
            layer.prompt_mask = attention_mask
        cache = _SlotCache(layers)
        with _fused_attention(self.model, layers) if self.fused_attention else nullcontext():
            out = self.model.base_model(
                input_ids=input_ids,
                attention_mask=_masks(allowed, distance, self.windows, self.model.dtype),
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
        last = (attention_mask.sum(dim=1) - 1).view(-1, 1, 1).expand(-1, 1, out.last_hidden_state.shape[-1])
        hidden = out.last_hidden_state.gather(1, last)[:, 0]
        kv = [t for layer in layers for t in (layer.keys, layer.values)]
        return (_head(self.model, hidden), *kv, *((hidden,) if self.hidden else ()))


@contextmanager
def _fused_attention(model: Any, layers: list[_SlotLayer]) -> Iterator[None]:
    slot_attention.register()
    before = model.config._attn_implementation
    model.config._attn_implementation = slot_attention.ATTN_IMPL
    slot_attention.ACTIVE.append(layers)
    try:
        yield
    finally:
        slot_attention.ACTIVE.pop()
        model.config._attn_implementation = before


class Decode(torch.nn.Module):
    """One token per slot against the static cache (see the module docstring)."""

    def __init__(self, model: Any, fused_attention: bool = False) -> None:
        super().__init__()
        self.model = model
        self.fused_attention = fused_attention

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, write_pos: torch.Tensor, *past: torch.Tensor
    ) -> Any:
        fused = self.fused_attention
        layers = [_SlotLayer(past[2 * i], past[2 * i + 1], write_pos, fused) for i in range(num_layers(self.model))]
        cache = _SlotCache(layers)
        max_seq = past[0].shape[2]
        allowed = torch.arange(max_seq)[None, :] <= write_pos[:, None]
        distance = (write_pos[:, None] - torch.arange(max_seq)[None, :])[:, None, None, :]
        masks = _masks(
            allowed[:, None, None, :], distance, sliding_windows(self.model.config, max_seq), self.model.dtype
        )
        with _fused_attention(self.model, layers) if fused else nullcontext():
            out = self.model.base_model(
                input_ids=input_ids,
                attention_mask=masks,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
        logits = _head(self.model, out.last_hidden_state[:, -1])
        kv = [t for layer in layers for t in (layer.keys, layer.values)]
        return (logits, *kv)


class Verify(torch.nn.Module):
    """``steps`` tokens per slot against the static cache: the target's check of a draft's proposals.

    ``input_ids``/``position_ids [batch, steps]``, ``write_pos [batch]`` (where the first of them goes)
    and the caches -> ``logits [batch, steps, vocab]`` (one row per position) and the caches with the
    ``steps`` new keys/values written at ``write_pos .. write_pos + steps - 1``. Query ``i`` of a slot
    attends to positions ``0 .. write_pos + i``: whatever a rejected proposal left beyond is masked.
    """

    def __init__(self, model: Any, fused_attention: bool = False, hidden: bool = False) -> None:
        super().__init__()
        self.model = model
        self.fused_attention = fused_attention
        self.hidden = hidden

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, write_pos: torch.Tensor, *past: torch.Tensor
    ) -> Any:
        fused = self.fused_attention
        steps = input_ids.shape[1]
        layers = [
            _SlotLayer(past[2 * i], past[2 * i + 1], write_pos, fused, steps) for i in range(num_layers(self.model))
        ]
        cache = _SlotCache(layers)
        max_seq = past[0].shape[2]
        last = write_pos[:, None] + torch.arange(steps)[None, :]  # [batch, steps]
        allowed = torch.arange(max_seq)[None, None, :] <= last[:, :, None]
        distance = last[:, None, :, None] - torch.arange(max_seq)[None, None, None, :]
        masks = _masks(allowed[:, None], distance, sliding_windows(self.model.config, max_seq), self.model.dtype)
        with _fused_attention(self.model, layers) if fused else nullcontext():
            out = self.model.base_model(
                input_ids=input_ids,
                attention_mask=masks,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
        logits = _head(self.model, out.last_hidden_state)
        kv = [t for layer in layers for t in (layer.keys, layer.values)]
        return (logits, *kv, *((out.last_hidden_state,) if self.hidden else ()))


#: The layer types these graphs mask (``sliding_windows``); any other (chunked, linear attention) is refused.
LAYER_TYPES = ("full_attention", "sliding_attention")


def unsupported(config: Any, max_seq_len: int) -> str:
    """Why these graphs would not compute what the model's own attention does ('' when they would): the mask is
    ours, and knows whole-cache and sliding-window layers only (no ALiBi bias, no chunked or linear attention);
    the rotary tables are traced once, so no rope that recomputes them from the positions a call sees."""
    other = sorted(set(getattr(config, "layer_types", None) or ()) - set(LAYER_TYPES))
    if other:
        return (
            f"its layer types {', '.join(other)} are not attention over the cache or a sliding window of it, "
            f"the two kinds of layer the exported graphs mask ({', '.join(LAYER_TYPES)})"
        )
    if _alibi(config):
        return "its ALiBi position bias is added to a mask the exported graphs build themselves"
    ropes = _rope_parameters(config)
    original = int(getattr(config, "max_position_embeddings", 0) or 0)
    if any(p.get("rope_type") == "dynamic" for p in ropes) and max_seq_len > original:
        return (
            f"its dynamic rope scaling (rope_type dynamic) rescales the rotary frequencies past its "
            f"max_position_embeddings ({original}) by the longest position seen so far, a state the exported "
            f"graphs do not keep, and --max-seq-len {max_seq_len} goes past it: build with --max-seq-len {original}"
        )
    for p in ropes:
        original = int(
            p.get("original_max_position_embeddings") or getattr(config, "original_max_position_embeddings", 0) or 0
        )
        if p.get("rope_type") == "longrope" and original and max_seq_len > original:
            return (
                f"its longrope scaling switches the rotary frequencies past {original} positions by the longest "
                f"position of a whole batch: build with --max-seq-len {original}"
            )
    return ""


def refuse_unsupported(config: Any, name: str, target: str, max_seq_len: int) -> None:
    """Refuse, naming the model, its family, the target and the feature, a model whose attention these graphs
    would not compute (``unsupported``): a wrong artifact would only fail validation minutes later."""
    why = unsupported(config, max_seq_len)
    if why:
        family = getattr(config, "model_type", None) or type(config).__name__
        raise UnsupportedModelError(f"{name} ({family}) cannot be built for {target}: {why}")


def _alibi(config: Any) -> bool:
    """Whether the model's attention adds an ALiBi bias: Falcon's ``alibi`` flag, MPT's attention config's; Bloom's
    always (its config has no flag: transformers builds the bias from the 2D attention mask in every forward)."""
    flags = (getattr(config, "alibi", False), getattr(getattr(config, "attn_config", None), "alibi", False))
    return any(flags) or getattr(config, "model_type", "") == "bloom"


@contextmanager
def default_rope_within_original_length(module: torch.nn.Module) -> Iterator[None]:
    """Trace a dynamic rope as the default one it is within ``max_position_embeddings`` (``unsupported`` refuses
    longer caches): transformers' dynamic update compares the longest position with that length, a branch on a
    tensor the export cannot take, and leaves the tables computed at init unchanged below it."""
    saved: dict[Any, Any] = {}
    rotary: Any  # transformers' rotary modules keep rope_type as a plain attribute (a dict per layer type)
    for rotary in module.modules():
        kind = getattr(rotary, "rope_type", None)
        if isinstance(kind, str) and "dynamic" in kind:
            saved[rotary], rotary.rope_type = kind, "default"
        elif isinstance(kind, dict) and any("dynamic" in str(v) for v in kind.values()):
            saved[rotary] = kind
            rotary.rope_type = {k: "default" if "dynamic" in str(v) else v for k, v in kind.items()}
    try:
        yield
    finally:
        for rotary, kind in saved.items():
            rotary.rope_type = kind


def _rope_parameters(config: Any) -> list[dict[str, Any]]:
    """The config's rope parameters: one dict, or one per layer type (Gemma 3's local and global rope)."""
    params = getattr(config, "rope_parameters", None) or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        return list(params.values())
    return [params] if isinstance(params, dict) else []


def kv_shape(model: Any) -> tuple[int, int]:
    """``(kv_heads, head_dim)`` of the model's attention, read from its config."""
    config = model.config
    heads = int(getattr(config, "num_attention_heads", 0) or config.n_head)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    hidden = int(getattr(config, "hidden_size", 0) or config.n_embd)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return kv_heads, head_dim
