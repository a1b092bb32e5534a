"""Decode attention as one ``com.microsoft::GroupQueryAttention`` per layer (onnxruntime's decode graph).

The plain decode graph (``compiler.generative.graphs.Decode``) scatters the new token into the static
cache and attends over all ``max_seq_len`` positions under a mask, with the KV heads repeated to the
query heads: every step copies and reads the whole cache. ONNX Runtime's GroupQueryAttention does what ONNX Runtime
GenAI's decoder does instead: with ``past_key`` and ``present_key`` bound to one buffer of
``max_seq_len`` positions ("past_present_share_buffer"), it writes each slot's new key/value at
``seqlens_k[b]`` and attends over the first ``seqlens_k[b] + 1`` positions only, sharing each KV head
across its query heads without copies (ORT's contrib-op schema, ``GroupQueryAttention`` since
version 1 of com.microsoft: BNSH cache, ``seqlens_k`` = total length - 1 per slot,
``total_sequence_length`` the batch's longest total).

How it gets into the graph: a torch custom op ``aotforge::slot_gqa`` (with an eager reference that
the tests compare against transformers) stands in for the attention, reached through transformers'
``AttentionInterface`` under the name :data:`ATTN_IMPL`; the ONNX exporter translates the op with
:func:`slot_gqa_onnx`. RoPE stays the model's own (``do_rotary=0``), so any rotary variant the
model computes is kept as it is.

The prefill graph runs the same op over the whole prompt with no past (``aotforge::prompt_gqa``, what
ONNX Runtime GenAI's model builder emits for the prompt too): causal attention with each KV head shared
by its query heads, ``present_*`` the prompt's keys/values ``[B, KV, S, D]``. Prompts are right-padded
(``targets.generative.decoding.pack_prompts``), so a real token never attends to padding and
``seqlens_k`` is ``S - 1`` for every row: a padded row's tail computes values nobody reads, and decode
overwrites its cache there.
"""

from __future__ import annotations

from typing import Any

import torch

from aotforge.core.decoder import sliding_windows

#: The transformers attention implementation name the decode export switches the model to.
ATTN_IMPL = "aotforge_slot_gqa"

_INT32 = 6  # onnx.TensorProto.INT32

#: The cache layers of the fused decode graph now running (``graphs.Decode`` pushes and pops them): each
#: has ``keys``, ``values`` (the cache in, then the updated cache) and ``write_pos``.
ACTIVE: list[list[Any]] = []


@torch.library.custom_op("aotforge::slot_gqa", mutates_args=())
def slot_gqa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    past_key: torch.Tensor,
    past_value: torch.Tensor,
    write_pos: torch.Tensor,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``query [B, S, H*D]``, ``key``/``value [B, S, KV*D]``, caches ``[B, KV, max_seq, D]`` -> output, caches.

    The eager meaning (what GroupQueryAttention computes): ``write_pos`` is each slot's *last* new
    position (GQA's ``seqlens_k``): its ``S`` new keys/values are written at ``write_pos - S + 1 ..
    write_pos``, and new query ``i`` attends to positions ``0 .. write_pos - S + 1 + i``. Decode has
    ``S = 1``; the verify graph ``S`` = its width. ``window`` > 0: each query attends to its last ``window``
    positions only (a sliding window, as ``local_window_size``); ``softcap`` > 0: the scores are soft-capped,
    ``softcap * tanh(scores / softcap)``, as ``softcap`` (both ORT's CPU kernel computes as transformers does).
    """
    batch, steps, _ = query.shape
    head_dim = past_key.shape[-1]
    q = query.view(batch, steps, num_heads, head_dim).transpose(1, 2)
    k = key.view(batch, steps, kv_num_heads, head_dim).transpose(1, 2)
    v = value.view(batch, steps, kv_num_heads, head_dim).transpose(1, 2)
    at = write_pos[:, None] - steps + 1 + torch.arange(steps)[None, :]  # [B, S]
    index = at[:, None, :, None].expand(-1, kv_num_heads, steps, head_dim)
    present_key = past_key.scatter(2, index, k)
    present_value = past_value.scatter(2, index, v)
    groups = num_heads // kv_num_heads
    scores = _capped(q @ present_key.repeat_interleave(groups, dim=1).transpose(2, 3) * scale, softcap)
    keys = torch.arange(past_key.shape[2])[None, None, :]
    allowed = keys <= at[:, :, None]  # [B, S, max_seq]
    if window > 0:
        allowed = allowed & (keys > at[:, :, None] - window)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ present_value.repeat_interleave(groups, dim=1)
    return out.transpose(1, 2).reshape(batch, steps, num_heads * head_dim), present_key, present_value


@slot_gqa.register_fake
def _(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    past_key: torch.Tensor,
    past_value: torch.Tensor,
    write_pos: torch.Tensor,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(query), torch.empty_like(past_key), torch.empty_like(past_value)


@torch.library.custom_op("aotforge::prompt_gqa", mutates_args=())
def prompt_gqa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``query [B, S, H*D]``, ``key``/``value [B, S, KV*D]`` -> output ``[B, S, H*D]``, keys/values
    ``[B, KV, S, D]``: causal attention over the prompt (GroupQueryAttention with no past).

    ``attention_mask [B, S]`` (right padding) is taken for its shape only: the ONNX translation reads the
    batch and prompt length from a graph input, so no node of the rotated q / k stays alive for a Shape."""
    batch, steps, _ = query.shape
    head_dim = query.shape[-1] // num_heads
    q = query.view(batch, steps, num_heads, head_dim).transpose(1, 2)
    k = key.view(batch, steps, kv_num_heads, head_dim).transpose(1, 2)
    v = value.view(batch, steps, kv_num_heads, head_dim).transpose(1, 2)
    groups = num_heads // kv_num_heads
    scores = _capped(q @ k.repeat_interleave(groups, dim=1).transpose(2, 3) * scale, softcap)
    causal = torch.ones(steps, steps, dtype=torch.bool).tril()
    if window > 0:
        causal = causal & ~torch.ones(steps, steps, dtype=torch.bool).tril(-window)
    scores = scores.masked_fill(~causal, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v.repeat_interleave(groups, dim=1)
    return out.transpose(1, 2).reshape(batch, steps, num_heads * head_dim), k.contiguous(), v.contiguous()


def _capped(scores: torch.Tensor, softcap: float) -> torch.Tensor:
    return torch.tanh(scores / softcap) * softcap if softcap > 0 else scores


@prompt_gqa.register_fake
def _(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, steps, _ = key.shape
    head_dim = query.shape[-1] // num_heads
    kv = key.new_empty(batch, kv_num_heads, steps, head_dim)
    return torch.empty_like(query), kv, torch.empty_like(kv)


def slot_gqa_onnx(
    query: Any,
    key: Any,
    value: Any,
    past_key: Any,
    past_value: Any,
    write_pos: Any,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> Any:
    """The ONNX translation: ``seqlens_k`` is ``write_pos`` (the total length after these tokens, minus 1)."""
    from onnxscript import opset18 as op

    seqlens_k = op.Cast(write_pos, to=_INT32)
    total = op.Cast(op.Add(op.ReduceMax(write_pos, keepdims=0), op.Constant(value_int=1)), to=_INT32)
    return _gqa_op()(
        query,
        key,
        value,
        past_key,
        past_value,
        seqlens_k,
        total,
        num_heads=num_heads,
        kv_num_heads=kv_num_heads,
        scale=scale,
        local_window_size=window if window > 0 else -1,
        softcap=softcap,
    )


def prompt_gqa_onnx(
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    num_heads: int,
    kv_num_heads: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> Any:
    """No past inputs; ``total_sequence_length`` the prompt's length, ``seqlens_k`` that minus 1 for every row."""
    from onnxscript import opset18 as op

    one: Any = op.Constant(value_int=1)
    shape: Any = op.Shape(attention_mask)
    steps: Any = op.Gather(shape, one)  # a scalar
    start: Any = op.Constant(value_ints=[0])
    batch = op.Slice(shape, start, op.Constant(value_ints=[1]))
    last: Any = op.Expand(op.Sub(steps, one), batch)  # [batch]
    return _gqa_op()(
        query,
        key,
        value,
        None,
        None,
        op.Cast(last, to=_INT32),
        op.Cast(steps, to=_INT32),
        num_heads=num_heads,
        kv_num_heads=kv_num_heads,
        scale=scale,
        local_window_size=window if window > 0 else -1,
        softcap=softcap,
    )


def _gqa_op() -> Any:
    """GroupQueryAttention as an onnxscript op: ONNX's registry has no com.microsoft schemas, so the part of
    ORT's schema this graph uses (its first seven inputs, three outputs, five attributes) is declared here."""
    import onnx
    from onnxscript.values import Op, Opset

    param = onnx.defs.OpSchema.FormalParameter
    attr = onnx.defs.OpSchema.Attribute
    kinds = onnx.defs.OpSchema.AttrType
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    floats = ["tensor(float)"]
    schema = onnx.defs.OpSchema(
        "GroupQueryAttention",
        "com.microsoft",
        1,
        inputs=[
            *(param(n, "T") for n in ("query", "key", "value")),
            *(param(n, "T", param_option=optional) for n in ("past_key", "past_value")),
            param("seqlens_k", "M"),
            param("total_sequence_length", "M"),
        ],
        outputs=[param(n, "T") for n in ("output", "present_key", "present_value")],
        type_constraints=[("T", floats, ""), ("M", ["tensor(int32)"], "")],
        attributes=[
            attr("num_heads", kinds.INT, "", required=True),
            attr("kv_num_heads", kinds.INT, "", required=True),
            attr("scale", kinds.FLOAT, "", required=False),
            attr("local_window_size", kinds.INT, "", required=False),
            attr("softcap", kinds.FLOAT, "", required=False),
        ],
    )
    return Op(Opset("com.microsoft", 1), "GroupQueryAttention", schema)


def translation_table() -> dict[Any, Any]:
    """What ``torch.onnx.export(custom_translation_table=...)`` needs for a graph using these ops."""
    return {torch.ops.aotforge.slot_gqa.default: slot_gqa_onnx, torch.ops.aotforge.prompt_gqa.default: prompt_gqa_onnx}


def slot_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function: ``key``/``value`` are this step's only (the slot cache passes them
    through); the layer's cache and write positions come from the cache the decode graph installed."""
    if not ACTIVE:
        raise RuntimeError("slot attention runs only inside a graphs module built with fused_attention=True")
    layer = ACTIVE[-1][int(module.layer_idx)]
    batch, heads, steps, head_dim = query.shape
    kv_heads = key.shape[1]
    scale = float(scaling) if scaling is not None else head_dim**-0.5
    # the layer's window as the plain graphs' banded mask has it; the cap as the layer passes it (Gemma 2)
    window, softcap = layer_window(module.config, int(module.layer_idx)), float(kwargs.get("softcap") or 0.0)
    if layer.write_pos is None:  # prefill: the whole prompt, no past
        out, layer.keys, layer.values = torch.ops.aotforge.prompt_gqa(
            query.transpose(1, 2).reshape(batch, steps, heads * head_dim),
            key.transpose(1, 2).reshape(batch, steps, kv_heads * head_dim),
            value.transpose(1, 2).reshape(batch, steps, kv_heads * head_dim),
            layer.prompt_mask,
            heads,
            kv_heads,
            scale,
            window,
            softcap,
        )
        return out.view(batch, steps, heads, head_dim), None
    steps_in = layer.steps  # decode: 1; verify: its width, and the op takes each slot's last position
    last_pos = layer.write_pos if isinstance(steps_in, int) and steps_in == 1 else layer.write_pos + (steps - 1)
    out, layer.keys, layer.values = torch.ops.aotforge.slot_gqa(
        query.transpose(1, 2).reshape(batch, steps, heads * head_dim),
        key.transpose(1, 2).reshape(batch, steps, kv_heads * head_dim),
        value.transpose(1, 2).reshape(batch, steps, kv_heads * head_dim),
        layer.keys,
        layer.values,
        last_pos,
        heads,
        kv_heads,
        scale,
        window,
        softcap,
    )
    return out.view(batch, steps, heads, head_dim), None


def layer_window(config: Any, layer: int) -> int:
    """The sliding window of layer ``layer`` (``core.decoder.sliding_windows``), 0 where it attends to all."""
    windows = sliding_windows(config, None)
    if "" in windows:
        return windows[""]
    types = getattr(config, "layer_types", None) or ()
    return windows.get(types[layer], 0) if layer < len(types) else 0


def register() -> None:
    """Make :data:`ATTN_IMPL` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTN_IMPL, slot_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPL, sdpa_mask)
