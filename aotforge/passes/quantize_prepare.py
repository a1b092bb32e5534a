"""Graph preparation for dynamic INT8 on ONNX Runtime: QAttention-ready Attention nodes and activation smoothing.

ORT's quantizer turns a com.microsoft ``Attention`` into ``QAttention`` (int8 QKV projection)
only when its weight is an initializer, it has no ``qkv_hidden_sizes`` and no
``attention_bias`` (QAttention has no such input). The fusion leaves the packed QKV weight
behind a Concat of initializers and the padding mask as an additive 4-D bias; both are
rewritten here, the mask only where calibration data shows it is exactly a key-padding mask of
a 0/1 integer graph input, and stays one when that input changes (then ``mask_index`` carries
that input and ORT rebuilds the same mask). Token ids are 0 exactly where a tokenizer pads too:
taken for the mask, they gave QAttention a "mask" of token ids, right on padded sentences and
wrong on any other mask (cosine 0.65 with every token attended).

``split_skip_layer_norm`` undoes the SkipLayerNormalization fusion: ONNX Runtime 1.32's CPU
kernel for it is several times slower than Add + LayerNormalization, and once the projections are
int8 such fp32 ops are most of what is left.

Smoothing (SmoothQuant's per-channel migration, Xiao et al. 2023) divides each input channel
of a quantized MatMul / Attention by ``s_j = max|X_j|^a / max|W_j|^(1-a)`` and multiplies the
weight's row j by it: exact in fp32, but the few outlier channels of BERT-style activations
(post-LayerNorm and GELU outputs, several times the rest) no longer set the per-tensor int8 scale. Only
channels above the median one are scaled down; none is scaled up, so a channel that was quiet
on the calibration data does not blow up on inputs unlike it (a user's MiniLM export, smoothed at
0.8 with the quiet channels amplified: held-out sentences 0.9980 mean, random token ids cosine
0.86; outliers only: 0.9985 and 0.989).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx_ir as ir

from aotforge.core.onnx_values import add_initializer, constant_array
from aotforge.passes.quantization_debug import Feeds, tensor_values

MS = "com.microsoft"


def fold_attention_weights(model: ir.Model) -> int:
    """Replace Attention weights computed by a Concat of initializers with one initializer."""
    graph, folded = model.graph, 0
    for node in list(graph):
        if not _is_attention(node) or len(node.inputs) < 2 or node.inputs[1] is None:
            continue
        concat = node.inputs[1].producer()
        if concat is None or concat.op_type != "Concat" or any(constant_array(v) is None for v in concat.inputs):
            continue
        axis = concat.attributes["axis"].as_int()
        array = np.concatenate([constant_array(v) for v in concat.inputs], axis=axis)  # type: ignore[misc]
        node.replace_input_with(1, add_initializer(graph, f"{node.name}_qkv_weight", array))
        folded += 1
        if not concat.outputs[0].uses():
            graph.remove(concat, safe=True)
    return folded


def drop_equal_qkv_sizes(model: ir.Model) -> int:
    """Remove ``qkv_hidden_sizes`` where Q, K and V are equal (the default), which QAttention requires."""
    dropped = 0
    for node in model.graph:
        sizes = node.attributes.get("qkv_hidden_sizes") if _is_attention(node) else None
        if sizes is not None and len(set(sizes.as_ints())) == 1:
            node.attributes.pop("qkv_hidden_sizes")
            dropped += 1
    return dropped


def bias_to_mask_index(model: ir.Model, feeds: list[Feeds]) -> list[str]:
    """Attention nodes whose attention_bias proved to be a key-padding mask now take ``mask_index``; their names."""
    graph = model.graph
    users = [n for n in graph if _is_attention(n) and len(n.inputs) == 6 and n.inputs[5] is not None]
    users = [n for n in users if n.inputs[3] is None and n.inputs[4] is None]
    biases = {n.inputs[5] for n in users if n.inputs[5] is not None}
    masks = [v for v in graph.inputs if v.dtype in (ir.DataType.INT64, ir.DataType.INT32) and len(v.shape or ()) == 2]
    if not users or not masks or not feeds:
        return []
    values = list(tensor_values(model, list(biases), feeds))
    matches: dict[ir.Value, ir.Value] = {}
    for bias in biases:
        for mask in masks:
            if not all(_is_binary(f[str(mask.name)]) for f in feeds):
                continue  # token ids are 0 exactly where a tokenizer pads, too: only a 0/1 input is a mask
            if all(_is_padding_bias(v[str(bias.name)], f[str(mask.name)]) for v, f in zip(values, feeds, strict=True)):
                if _follows(model, bias, mask, feeds):
                    matches[bias] = mask
                    break
    converted, casts = [], {}
    for node in users:
        node_bias = node.inputs[5]
        source = matches.get(node_bias) if node_bias is not None else None
        if source is None:
            continue
        if source not in casts:
            cast = ir.node("Cast", [source], {"to": int(ir.DataType.INT32)}, name=f"{source.name}_mask_index")
            cast.outputs[0].name, cast.outputs[0].dtype = f"{source.name}_mask_index", ir.DataType.INT32
            graph.insert_before(graph[0], cast)
            casts[source] = cast.outputs[0]
        node.replace_input_with(5, None)
        node.resize_inputs(4)
        node.replace_input_with(3, casts[source])
        converted.append(str(node.name))
    return converted


def _is_binary(array: np.ndarray) -> bool:
    return bool(np.isin(array, (0, 1)).all())


def _follows(model: ir.Model, bias: ir.Value, mask: ir.Value, feeds: list[Feeds]) -> bool:
    """Whether ``bias`` is still ``mask``'s padding bias when ``mask`` changes (random 0/1, first key kept).

    Calibration text pads at the end and the input ids are 0 exactly there: agreeing on it does not
    show that the bias is computed from ``mask``. Changed masks do.
    """
    rng = np.random.default_rng(0)
    changed = []
    for feed in feeds:
        other = rng.integers(0, 2, feed[str(mask.name)].shape).astype(feed[str(mask.name)].dtype)
        other[..., 0] = 1
        changed.append({**feed, str(mask.name): other})
    got = tensor_values(model, [bias], changed)
    return all(_is_padding_bias(v[str(bias.name)], f[str(mask.name)]) for v, f in zip(got, changed, strict=True))


def _is_padding_bias(bias: np.ndarray, mask: np.ndarray) -> bool:
    """``bias`` [batch, 1|heads, q, k] is 0 where ``mask`` [batch, k] is 1 and hugely negative where it is 0."""
    if bias.ndim != 4 or bias.shape[0] != mask.shape[0] or bias.shape[-1] != mask.shape[-1]:
        return False
    keep = np.broadcast_to(mask[:, None, None, :].astype(bool), bias.shape)
    return bool(np.all(bias[keep] == 0) and np.all(bias[~keep] <= -1e4))


def smooth(model: ir.Model, feeds: list[Feeds], alpha: float, min_ratio: float, skip: Iterable[str] = ()) -> list[str]:
    """Smooth the activations of MatMul / Attention nodes with a constant 2-D weight; names of those rewritten.

    A node is smoothed only where its largest input channel exceeds ``min_ratio`` times the median
    of its channel maxima (0: every node), so graphs without outliers pay no extra Mul.
    """
    graph, skipped = model.graph, set(skip)
    nodes = [n for n in graph if _weighted(n) and str(n.name) not in skipped]
    inputs = list({n.inputs[0] for n in nodes if n.inputs[0] is not None})
    if not nodes or not feeds:
        return []
    peaks: dict[str, np.ndarray] = {}
    for values in tensor_values(model, inputs, feeds):
        for name, array in values.items():
            channel_max = np.abs(array.reshape(-1, array.shape[-1])).max(axis=0)
            peaks[name] = np.maximum(peaks.get(name, channel_max), channel_max)
    smoothed = []
    for node in nodes:
        x, w = node.inputs[0], node.inputs[1]
        assert x is not None and w is not None  # _weighted checked both
        act, weight = np.maximum(peaks[str(x.name)], 1e-5), constant_array(w)
        if weight is None or act.shape[0] != weight.shape[0] or act.max() < min_ratio * np.median(act):
            continue
        scale = act**alpha / np.maximum(np.abs(weight).max(axis=1), 1e-5) ** (1 - alpha)
        # Outlier channels only: relative to the median channel, none is amplified (s >= 1). Normalised to
        # a geometric mean of 1 instead, the quiet channels of the calibration data were scaled up, and inputs
        # unlike it (random token ids, longer sequences) lost the fp32 result (cosine 0.86 where plain got 0.98).
        scale = np.clip(scale / np.median(scale), 1.0, 1e3).astype(np.float32)
        inverse = add_initializer(graph, f"{node.name}_smooth", (1 / scale).astype(np.float32))
        mul = ir.node("Mul", [x, inverse], name=f"{node.name}_smooth")
        mul.outputs[0].name, mul.outputs[0].shape = f"{node.name}_smoothed", x.shape
        if x.dtype is not None:
            mul.outputs[0].dtype = x.dtype
        graph.insert_before(node, mul)
        node.replace_input_with(0, mul.outputs[0])
        node.replace_input_with(1, add_initializer(graph, f"{node.name}_smooth_weight", weight * scale[:, None]))
        if not w.uses() and w.name in graph.initializers:
            graph.initializers.pop(str(w.name))
        smoothed.append(str(node.name))
    return smoothed


def smoothed_nodes(model: ir.Model) -> list[str]:
    """Names of the nodes :func:`smooth` rewrote (it names each inserted Mul ``<node>_smooth``)."""
    return [
        str(n.name)[: -len("_smooth")] for n in model.graph if n.op_type == "Mul" and str(n.name).endswith("_smooth")
    ]


def smoothable(model: ir.Model) -> int:
    """How many MatMul / Attention nodes :func:`smooth` could rewrite (a constant 2-D float weight)."""
    return sum(1 for n in model.graph if _weighted(n))


def split_skip_layer_norm(model: ir.Model) -> int:
    """Rewrite com.microsoft SkipLayerNormalization to Add (+ bias Add) + LayerNormalization; how many.

    Nodes whose mean / inverse-std outputs are read are left alone; the optional fourth output (the
    sum before normalisation) is the Add's output. ORT's offline optimizer does not fuse this
    order (Add(x, skip) first, then the bias) back.
    """
    graph, split = model.graph, 0
    for node in list(graph):
        if node.op_type != "SkipLayerNormalization" or node.domain != MS or len(node.inputs) < 3:
            continue
        if any(o.uses() or o.is_graph_output() for o in node.outputs[1:3]):
            continue
        x, skip, gamma = node.inputs[:3]
        beta = node.inputs[3] if len(node.inputs) > 3 else None
        bias = node.inputs[4] if len(node.inputs) > 4 else None
        epsilon = node.attributes.get("epsilon")
        new = [ir.node("Add", [x, skip], name=f"{node.name}_add")]
        if bias is not None:
            new.append(ir.node("Add", [new[-1].outputs[0], bias], name=f"{node.name}_bias"))
        total = new[-1].outputs[0]
        norm_inputs = [total, gamma] + ([beta] if beta is not None else [])
        eps = epsilon.as_float() if epsilon is not None else 1e-12
        new.append(ir.node("LayerNormalization", norm_inputs, {"axis": -1, "epsilon": eps}, name=f"{node.name}_ln"))
        for step in new:
            step.outputs[0].name, step.outputs[0].shape = f"{step.name}_out", x.shape if x is not None else None
            if x is not None and x.dtype is not None:
                step.outputs[0].dtype = x.dtype
        old, replacement = [node.outputs[0]], [new[-1].outputs[0]]
        if len(node.outputs) > 3 and (node.outputs[3].uses() or node.outputs[3].is_graph_output()):
            old.append(node.outputs[3])
            replacement.append(total)
        ir.convenience.replace_nodes_and_values(graph, node, [node], new, old, replacement)
        split += 1
    return split


def _is_attention(node: ir.Node) -> bool:
    return node.op_type == "Attention" and node.domain == MS


def _weighted(node: ir.Node) -> bool:
    """A MatMul or Attention whose weight (input 1) is a 2-D float constant used by it alone."""
    if not (node.op_type == "MatMul" and node.domain in ("", "ai.onnx") or _is_attention(node)):
        return False
    if len(node.inputs) < 2 or node.inputs[0] is None or node.inputs[1] is None:
        return False
    weight = constant_array(node.inputs[1])
    return weight is not None and weight.ndim == 2 and weight.dtype == np.float32 and len(node.inputs[1].uses()) == 1
