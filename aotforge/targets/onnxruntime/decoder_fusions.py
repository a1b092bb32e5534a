"""ONNX Runtime contrib-op fusions for the onnxruntime target's text-generation graphs.

The exported graphs spell RMSNorm and rotary embeddings in standard ops (RMSNorm: Pow, ReduceMean, Add,
Sqrt, Reciprocal, Mul, Mul; rotary: Mul, Slice, Slice, Neg, Concat, Mul, Add per tensor), which ONNX
Runtime's own optimizer leaves as they are. At decode each of those runs on one token's vector: the cost
is per node, not per byte (1374 kernels per step in a 30-layer SmolLM-shaped decode, against 309 in ONNX
Runtime GenAI's graph of the same model; 338 after these rewrites). They put in what GenAI's model
builder emits:

* MatMuls of one activation against constant weights (q / k / v, gate / up) as one MatMul over the
  weights side by side and a Split (the same bytes in every graph, so stored once);
* ``SimplifiedLayerNormalization`` for each RMSNorm, ``com.microsoft::SkipSimplifiedLayerNormalization``
  where a residual Add feeds it (onnxscript's ORT fusion rules);
* ``com.microsoft::RotaryEmbedding`` for each rotary application whose cos / sin are the model's
  ``position_ids * inv_freq`` (a constant) duplicated: the cos / sin tables for positions
  ``0 .. max_seq_len - 1`` become constants of ``[max_seq_len, head_dim / 2]``;
* in every graph (prefill's GroupQueryAttention runs over the prompt with no past), that rotation moved
  into GroupQueryAttention (``do_rotary`` with the same tables and the graph's ``position_ids``), fed the
  packed QKV MatMul's output as is.

A pattern that does not match exactly (another rotary variant, an attention scaling, a LayerNorm
model such as GPT-2) is left as exported: the rewrite only ever replaces what it recognises.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from aotforge.core.onnx_values import add_initializer


def pack_for_ort(model: ir.Model) -> dict[str, int]:
    """The standard-op part (MatMul packing), run before the build's passes: a pass such as weight-only
    quantizes the packed MatMuls, and the ONNX checker the passes run knows no contrib op."""
    import onnx_ir.passes.common as common_passes

    counts = {"packed_matmuls": _pack_matmuls(model)}
    common_passes.RemoveUnusedNodesPass()(model)
    return counts


def fuse_for_ort(model: ir.Model, max_positions: int) -> dict[str, int]:
    """The contrib-op fusions, after the passes; rewrites ``model`` in place, returns the number of each made."""
    import onnx_ir.passes.common as common_passes
    from onnxscript.rewriter.ort_fusions.rms_normalization import fuse_rms_normalization
    from onnxscript.rewriter.ort_fusions.skip_normalization import fuse_skip_rms_normalization

    counts = {"rotary_embedding": _rotary_rules(max_positions).apply_to_model(model)}
    counts["rms_normalization"] = fuse_rms_normalization(model)
    counts["skip_rms_normalization"] = fuse_skip_rms_normalization(model)
    counts["rotary_in_attention"], counts["rotary_in_attention_declined"] = _rotary_into_attention(model)
    counts["packed_qkv_attention"] = _packed_attention(model)
    counts["identity_reshapes"] = _identity_reshapes(model)
    common_passes.RemoveUnusedNodesPass()(model)
    if any(counts.values()) and "com.microsoft" not in model.opset_imports:
        model.opset_imports["com.microsoft"] = 1
    return counts


def _pack_matmuls(model: ir.Model) -> int:
    """MatMuls of one activation against constant weights (Q / K / V, gate / up) as one MatMul against the
    weights side by side, then a Split: at decode each MatMul streams its weight once on every thread, and
    one wide call keeps both threads busy where two or three narrow ones each wait for the slower thread.

    Deterministic (graph order), so every graph of a build packs the same bytes and they are stored once.
    Returns the MatMuls replaced."""
    groups: dict[int, list[ir.Node]] = {}
    for node in model.graph:
        if node.op_type == "MatMul" and node.domain == "" and _weight(node) is not None and node.inputs[0]:
            groups.setdefault(id(node.inputs[0]), []).append(node)
    packed = 0
    for nodes in groups.values():
        weights = [_weight(n) for n in nodes]
        if len(nodes) < 2 or len({w.shape[0] for w in weights if w is not None}) != 1:
            continue
        arrays = [w for w in weights if w is not None]
        first = nodes[0]
        joined = add_initializer(model.graph, f"{first.inputs[1].name}_packed", np.concatenate(arrays, axis=1))  # type: ignore[union-attr]
        sizes = add_initializer(model.graph, f"{joined.name}_split", np.array([a.shape[1] for a in arrays], np.int64))
        matmul = ir.node("MatMul", [first.inputs[0], joined], name=f"{first.name}_packed")
        split = ir.node("Split", [matmul.outputs[0], sizes], attributes={"axis": -1}, num_outputs=len(nodes))
        split.name = f"{first.name}_split"
        model.graph.insert_before(first, [matmul, split])
        for old, new in zip(nodes, split.outputs, strict=True):
            new.shape, new.type = old.outputs[0].shape, old.outputs[0].type
            old.outputs[0].replace_all_uses_with(new, replace_graph_outputs=True)
        packed += len(nodes)
    return packed


def _weight(node: ir.Node) -> np.ndarray | None:
    """The MatMul's constant float weight ``[K, N]``, or None."""
    value = node.inputs[1] if len(node.inputs) == 2 else None
    tensor = value.const_value if value is not None else None
    if tensor is None or tensor.dtype != ir.DataType.FLOAT or len(tensor.shape) != 2:
        return None
    return tensor.numpy()


def _packed_attention(model: ir.Model) -> int:
    """GroupQueryAttention over one packed ``[batch, seq, (heads + 2 kv_heads) * head_dim]`` QKV input (its
    packed form, ``key`` / ``value`` absent) where its q, k and v are the three parts of one packed MatMul."""
    done = 0
    for node in list(model.graph):
        if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft":
            continue
        parts = node.inputs[:3]
        split = parts[0].producer() if parts[0] is not None else None
        if split is None or split.op_type != "Split" or len(split.outputs) != 3 or list(split.outputs) != list(parts):
            continue
        node.replace_input_with(0, split.inputs[0])
        node.replace_input_with(1, None)
        node.replace_input_with(2, None)
        done += 1
    return done


def _rotary_into_attention(model: ir.Model) -> tuple[int, int]:
    """GroupQueryAttention takes the projections as the MatMuls make them and rotates q / k itself.

    The exported graph reshapes each projection to heads, transposes, rotates
    (``RotaryEmbedding`` after the rule above), transposes back and flattens again for the attention:
    10 nodes per layer that move no data of use. GQA with ``do_rotary=1`` and the same cos / sin tables
    and ``position_ids`` (its optional input 9) computes the same rotation inside the op.

    Returns ``(moved, declined)``: a rotation ORT's CPU kernel cannot take (``_cpu_rotary_fits``) stays a
    ``RotaryEmbedding`` of its own before the attention."""
    done = declined = 0
    for node in list(model.graph):
        if node.op_type != "GroupQueryAttention" or node.domain != "com.microsoft" or len(node.inputs) != 7:
            continue
        query, key = _unrotated(node.inputs[0]), _unrotated(node.inputs[1])
        value = _flat_projection(node.inputs[2])
        if query is None or key is None or value is None:
            continue
        (q, q_rot), (k, k_rot) = query, key
        if q_rot.inputs[1:] != k_rot.inputs[1:] or q_rot.attributes.get("interleaved", ir.AttrInt64("i", 0)).value:
            continue
        if not _cpu_rotary_fits(node, q, q_rot.inputs[2]):
            declined += 1
            continue
        node.resize_inputs(10)
        for index, new in ((0, q), (1, k), (2, value), (7, q_rot.inputs[2]), (8, q_rot.inputs[3])):
            node.replace_input_with(index, new)
        node.replace_input_with(9, q_rot.inputs[1])
        node.attributes["do_rotary"] = ir.AttrInt64("do_rotary", 1)
        node.attributes["rotary_interleaved"] = ir.AttrInt64("rotary_interleaved", 0)
        done += 1
    return done, declined


def _cpu_rotary_fits(node: ir.Node, query: ir.Value, cos: ir.Value | None) -> bool:
    """Whether ORT's GroupQueryAttention accepts these cos / sin tables at run time (its ``CheckRotaryCaches``,
    1.32): a head_dim that is a multiple of 16, a table of ``head_dim / 2`` or fewer columns, a multiple of 8.
    Anything else is refused when the session runs (Phi-3 or Granite at head_dim 24, Gemma at 40), not when it
    opens, so it is checked here, from the query's width and the op's ``num_heads``."""
    heads = node.attributes.get("num_heads")
    width = query.shape[2] if query.shape is not None and query.shape.rank() == 3 else None
    table = cos.const_value if cos is not None else None
    rotary = table.shape[1] if table is not None and len(table.shape) == 2 else None
    if heads is None or not isinstance(width, int) or not isinstance(rotary, int):
        return False
    head_dim, columns = divmod(width, int(heads.value))
    return columns == 0 and head_dim % 16 == 0 and rotary % 8 == 0 and rotary <= head_dim // 16 * 8


def _identity_reshapes(model: ir.Model) -> int:
    """A Reshape (or a chain of them) back to the shape its source had, as GroupQueryAttention's output goes
    through on its way to the o_proj MatMul (``[batch, seq, heads, head_dim]`` and back): each is a kernel
    call per layer and token that moves nothing. Shapes compare dim by dim, a named dim equal only to
    itself; a dim of unknown size never matches."""
    done = 0
    for node in list(model.graph):
        out = node.outputs[0] if node.op_type == "Reshape" and node.domain == "" else None
        if out is None or out.is_graph_output() or not out.uses() or not _known(out.shape):
            continue
        source = node.inputs[0]
        while source is not None and not (_known(source.shape) and list(source.shape) == list(out.shape)):  # type: ignore[arg-type]
            before = _producer(source, "Reshape")
            source = before.inputs[0] if before is not None else None
        if source is not None:
            out.replace_all_uses_with(source)
            done += 1
    return done


def _known(shape: ir.Shape | None) -> bool:
    return shape is not None and all(isinstance(d, int) or d.value is not None for d in shape)


def _unrotated(value: ir.Value | None) -> tuple[ir.Value, ir.Node] | None:
    """``Reshape(Transpose(RotaryEmbedding(Transpose(Reshape(x)))))`` -> ``(x, the RotaryEmbedding)``, x being
    ``[batch, seq, heads * head_dim]``; None for anything else."""
    node = _producer(value, "Reshape")
    node = _producer(node.inputs[0], "Transpose") if node else None
    rotary = _producer(node.inputs[0], "RotaryEmbedding") if node and _perm(node) else None
    node = _producer(rotary.inputs[0], "Transpose") if rotary and len(rotary.inputs) == 4 else None
    node = _producer(node.inputs[0], "Reshape") if node and _perm(node) else None
    source = node.inputs[0] if node is not None else None
    if source is None or rotary is None or not _rank(source, 3):
        return None
    return source, rotary


def _flat_projection(value: ir.Value | None) -> ir.Value | None:
    """``Reshape(Reshape(x))`` with ``x`` ``[batch, seq, kv_heads * head_dim]`` -> x (the value path)."""
    node = _producer(value, "Reshape")
    node = _producer(node.inputs[0], "Reshape") if node else None
    return node.inputs[0] if node is not None and _rank(node.inputs[0], 3) else None


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and node.op_type == op_type else None


def _perm(node: ir.Node) -> bool:
    perm = node.attributes.get("perm")
    return perm is not None and list(perm.value) == [0, 2, 1, 3]


def _rank(value: ir.Value | None, rank: int) -> bool:
    return value is not None and value.shape is not None and value.shape.rank() == rank


def _rotary_rules(max_positions: int) -> Any:
    from onnxscript.rewriter import _ir_utils, pattern

    class RotaryFusion(pattern.RewriteRuleClassBase):
        """``x * cos + rotate_half(x) * sin`` with ``cos, sin = Cos / Sin(concat(f, f))``, ``f = pos * inv_freq``."""

        def __init__(self) -> None:
            # The cos / sin nodes are shared by every layer: they stay until the unused-node pass drops them.
            super().__init__("AotforgeRotaryEmbedding", remove_nodes=False)
            self._tables: dict[int, tuple[ir.Value, ir.Value]] = {}

        def pattern(self, op: Any, x: Any, pos: Any, inv_freq: Any, pos_axis: Any, head_axis: Any) -> Any:
            freqs = op.Mul(op.Cast(op.Unsqueeze(pos, pos_axis), to=ir.DataType.FLOAT), inv_freq)
            emb = op.Concat(freqs, freqs, axis=-1)
            cos = op.Unsqueeze(op.Cos(emb), head_axis)
            sin = op.Unsqueeze(op.Sin(emb), head_axis)
            low = op.Slice(x, _allow_other_inputs=True, _outputs=["low"])
            high = op.Slice(x, _allow_other_inputs=True, _outputs=["high"])
            return op.Add(op.Mul(x, cos), op.Mul(op.Concat(op.Neg(high), low, axis=-1), sin))

        def check(
            self, context: Any, x: Any, pos: Any, inv_freq: Any, pos_axis: Any, head_axis: Any, low: Any, high: Any
        ) -> Any:
            result = pattern.MatchResult()
            freq = inv_freq.const_value
            if freq is None or freq.numpy().ndim != 1 or freq.dtype != ir.DataType.FLOAT:
                return result.fail("inv_freq is not a constant float vector", inv_freq)
            half = int(freq.numpy().shape[0])
            if x.shape is None or x.shape.rank() != 4 or x.shape[3] != 2 * half or x.dtype != ir.DataType.FLOAT:
                return result.fail("x is not float [batch, heads, seq, 2 * len(inv_freq)]", x)
            if pos.shape is None or pos.shape.rank() != 2:
                return result.fail("position_ids is not [batch, seq]", pos)
            if not (_ir_utils.is_singleton_value(pos_axis, -1) or _ir_utils.is_singleton_value(pos_axis, 2)):
                return result.fail("position_ids unsqueezed on another axis", pos_axis)
            if not _ir_utils.is_singleton_value(head_axis, 1):
                return result.fail("cos / sin unsqueezed on another axis than the heads'", head_axis)
            if not (_halves(low.producer(), 0, half) and _halves(high.producer(), half, 2 * half)):
                return result.fail("rotate_half does not split the last axis in halves")
            return result

        def rewrite(self, op: Any, x: Any, pos: Any, inv_freq: Any, **_: Any) -> Any:
            key = id(inv_freq)
            if key not in self._tables:
                angles = np.arange(max_positions, dtype=np.float32)[:, None] * inv_freq.const_value.numpy()[None, :]
                self._tables[key] = (
                    op.initializer(
                        ir.tensor(np.cos(angles).astype(np.float32)), name=f"rotary_cos_{len(self._tables)}"
                    ),
                    op.initializer(
                        ir.tensor(np.sin(angles).astype(np.float32)), name=f"rotary_sin_{len(self._tables)}"
                    ),
                )
            cos, sin = self._tables[key]
            return op.RotaryEmbedding(x, pos, cos, sin, interleaved=0, _domain="com.microsoft")

    return pattern.RewriteRuleSet([RotaryFusion.rule()])


def _halves(node: Any, start: int, end: int) -> bool:
    """A Slice of ``[start, end)`` (or to the end) along the last axis, step 1."""
    from onnxscript.rewriter import _ir_utils

    if node is None or node.op_type != "Slice" or len(node.inputs) < 4:
        return False
    starts, ends, axes = node.inputs[1], node.inputs[2], node.inputs[3]
    steps = node.inputs[4] if len(node.inputs) > 4 else None
    end_ok = _ir_utils.is_singleton_value(ends, end) or _ir_utils.is_singleton_value(ends, lambda v: v >= end)
    axis_ok = _ir_utils.is_singleton_value(axes, 3) or _ir_utils.is_singleton_value(axes, -1)
    step_ok = steps is None or _ir_utils.is_singleton_value(steps, 1)
    return bool(_ir_utils.is_singleton_value(starts, start) and end_ok and axis_ok and step_ok)
