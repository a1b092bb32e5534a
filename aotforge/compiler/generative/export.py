"""Export a causal LM's prefill and decode graphs (``generative.graphs``) to ONNX, sharing one weight file.

Why two ONNX files over one ``weights.data``: each graph is a plain ONNX model that ONNX Runtime
opens as a session and tvm's ONNX frontend imports as it would any other file (neither loads a
model with two graph functions as two entry points), and ONNX's external-data records (location,
offset, length) let both point at the same bytes. Initializers are matched by content (dtype,
shape, bytes), not by name: the exporter names folded constants differently per graph.
"""

from __future__ import annotations

import hashlib
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import onnx
import onnx_ir as ir
from onnx import numpy_helper
from onnx.external_data_helper import set_external_data

from aotforge.compiler.generative import collectives
from aotforge.compiler.generative.graphs import (
    Decode,
    Prefill,
    Verify,
    default_rope_within_original_length,
    kv_shape,
    num_layers,
)
from aotforge.compiler.torch_onnx_registry import share_torchlib_registry
from aotforge.core.decoder import WEIGHTS_FILE, DecoderSpec
from aotforge.core.errors import UnsupportedModelError, describe
from aotforge.targets.onnxruntime import slot_attention

#: Initializers smaller than this stay inside each graph (shapes, scalars, small tables).
_INLINE_BYTES = 1024
_ALIGN = 4096  # page-aligned offsets let a runtime map the file


def decoder_spec(model: Any, max_seq_len: int, max_batch: int) -> DecoderSpec:
    """The cache geometry of ``model`` (a transformers causal LM) for this build."""
    kv_heads, head_dim = kv_shape(model)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    return DecoderSpec(num_layers(model), kv_heads, head_dim, vocab, max_seq_len, max_batch)


def export_graphs(
    model: Any,
    shape: DecoderSpec,
    name: str,
    decode_attention: str = "masked",
    prefill_scope: AbstractContextManager[Any] | None = None,
    hidden: bool = False,
) -> tuple[ir.Model, ir.Model]:
    """The prefill and decode graphs as IR, inputs/outputs named as ``generative.graphs`` documents.

    ``decode_attention``: ``"masked"`` (standard ONNX ops: the new token scattered into the cache, attention
    over all of ``max_seq_len`` under a mask; any runtime) or ``"gqa"`` (onnxruntime's
    ``com.microsoft::GroupQueryAttention``, in place over each slot's filled length, and over the prompt in
    prefill: ``slot_attention``). ``hidden``: the prefill graph also returns ``hidden [batch, d]`` (``graphs``).
    """
    return (
        export_prefill(model, shape, name, decode_attention, prefill_scope, hidden),
        export_decode(model, shape, name, decode_attention),
    )


def _fused(decode_attention: str) -> bool:
    if decode_attention not in DECODE_ATTENTION:
        raise ValueError(f"decode_attention must be one of {', '.join(DECODE_ATTENTION)}, got {decode_attention!r}")
    return decode_attention == "gqa"


def export_prefill(
    model: Any,
    shape: DecoderSpec,
    name: str,
    decode_attention: str = "masked",
    prefill_scope: AbstractContextManager[Any] | None = None,
    hidden: bool = False,
) -> ir.Model:
    """The prefill graph of :func:`export_graphs`: the prompt's logits and the cache it fills (and with ``hidden``,
    last, the LM head's input at the last prompt position)."""
    import torch

    fused = _fused(decode_attention)
    batch = torch.export.Dim("batch", min=1, max=max(shape.max_batch, 2))
    prompt = torch.export.Dim("prompt", min=1, max=shape.max_seq_len)
    # Example sizes of 2 and 4: torch.export specializes a dim whose example size is 1.
    ids = torch.zeros(2, 4, dtype=torch.long)
    mask = torch.ones(2, 4, dtype=torch.long)
    pos = torch.arange(4).repeat(2, 1)
    with prefill_scope or nullcontext():
        return _export(
            Prefill(model, fused_attention=fused, max_seq_len=shape.max_seq_len, hidden=hidden),
            (ids, mask, pos),
            ["input_ids", "attention_mask", "position_ids"],
            ["logits", *shape.kv_names("present"), *(["hidden"] if hidden else [])],
            ({0: batch, 1: prompt},) * 3,
            name,
            slot_attention.translation_table() if fused else None,
        )


def export_decode(model: Any, shape: DecoderSpec, name: str, decode_attention: str = "masked") -> ir.Model:
    """The decode graph of :func:`export_graphs`: one token a slot against the cache."""
    import torch

    fused = _fused(decode_attention)
    batch = torch.export.Dim("batch", min=1, max=max(shape.max_batch, 2))
    cache = [torch.zeros(2, shape.kv_heads, shape.max_seq_len, shape.head_dim) for _ in range(2 * shape.layers)]
    step = (torch.zeros(2, 1, dtype=torch.long), torch.full((2, 1), 4), torch.full((2,), 4), *cache)
    return _export(
        Decode(model, fused_attention=fused),
        step,
        ["input_ids", "position_ids", "write_pos", *shape.kv_names("past")],
        ["logits", *shape.kv_names("present")],
        ({0: batch}, {0: batch}, {0: batch}, tuple([{0: batch}] * len(cache))),  # *past arrives as one tuple
        name,
        slot_attention.translation_table() if fused else None,
    )


def export_verify(
    model: Any, shape: DecoderSpec, name: str, decode_attention: str = "masked", hidden: bool = False
) -> ir.Model:
    """The verify graph (``graphs.Verify``): a dynamic number of query tokens per slot against the cache, the
    logits of every position; same inputs and caches as decode, ``logits [batch, steps, vocab]`` (and with
    ``hidden``, last, the LM head's input ``hidden [batch, steps, d]``)."""
    import torch

    fused = _fused(decode_attention)
    batch = torch.export.Dim("batch", min=1, max=max(shape.max_batch, 2))
    steps = torch.export.Dim("steps", min=1, max=shape.max_seq_len)
    cache = [torch.zeros(2, shape.kv_heads, shape.max_seq_len, shape.head_dim) for _ in range(2 * shape.layers)]
    width = 3  # an example size of 1 would specialize the dim
    ids = torch.zeros(2, width, dtype=torch.long)
    pos = (torch.arange(width) + 4).repeat(2, 1)
    return _export(
        Verify(model, fused_attention=fused, hidden=hidden),
        (ids, pos, torch.full((2,), 4), *cache),
        ["input_ids", "position_ids", "write_pos", *shape.kv_names("past")],
        ["logits", *shape.kv_names("present"), *(["hidden"] if hidden else [])],
        ({0: batch, 1: steps}, {0: batch, 1: steps}, {0: batch}, tuple([{0: batch}] * len(cache))),
        name,
        slot_attention.translation_table() if fused else None,
    )


#: The decode graph's attention kinds (``export_graphs``); a generative backend names the one it runs.
DECODE_ATTENTION = ("masked", "gqa")


def _export(
    module: Any,
    args: tuple,
    inputs: list[str],
    outputs: list[str],
    dims: tuple,
    name: str,
    translations: dict[Any, Any] | None = None,
) -> ir.Model:
    import torch

    share_torchlib_registry()
    try:
        with torch.inference_mode(False), torch.no_grad(), default_rope_within_original_length(module):
            program = torch.onnx.export(
                module.eval(),
                args,
                dynamo=True,
                verbose=False,
                input_names=inputs,
                output_names=outputs,
                dynamic_shapes=dims,
                # A rank graph's all-reduce (tensor_parallel.py) exports as one node; other graphs have none.
                custom_translation_table={**collectives.translation_table(), **(translations or {})},
            )
    except Exception as e:
        raise UnsupportedModelError(
            f"exporting the {type(module).__name__.lower()} graph of {name} failed: {describe(e)}; "
            "aotforge's text-generation export supports transformers causal LMs whose attention takes a 4D mask "
            "and a Cache (Llama, Qwen2, GPT-2 families)"
        ) from e
    if program is None:
        raise UnsupportedModelError(f"torch.onnx.export of {name} returned no program")
    return program.model


def save_shared(models: dict[str, ir.Model], out_dir: Path) -> dict[str, int]:
    """Write each model as ``<out_dir>/<file>`` with its large initializers in one ``weights.data``.

    Returns byte counts: the weight file, and what the graphs would hold without sharing.
    """
    offsets: dict[str, tuple[int, int]] = {}
    unshared = 0
    with (out_dir / WEIGHTS_FILE).open("wb") as data:
        for file_name, model in models.items():
            proto = ir.serde.serialize_model(model)
            for tensor in proto.graph.initializer:
                raw = tensor.raw_data or numpy_helper.to_array(tensor).tobytes()
                if len(raw) < _INLINE_BYTES:
                    continue
                unshared += len(raw)
                key = hashlib.sha256(f"{tensor.data_type}:{list(tensor.dims)}:".encode() + raw).hexdigest()
                if key not in offsets:
                    data.write(b"\0" * (-data.tell() % _ALIGN))
                    offsets[key] = (data.tell(), len(raw))
                    data.write(raw)
                for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                    tensor.ClearField(field)  # type: ignore[arg-type]
                tensor.raw_data = raw  # set_external_data wants the field present; it is cleared next
                set_external_data(tensor, WEIGHTS_FILE, *offsets[key])
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
            onnx.save(proto, out_dir / file_name)
        weight_bytes = data.tell()
    return {"weights_file_bytes": weight_bytes, "unshared_bytes": unshared}
