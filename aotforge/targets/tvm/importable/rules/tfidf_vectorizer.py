"""TfIdfVectorizer with ``pool_int64s`` over [C] or [B, C] integers (onnx's reference's counting)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from aotforge.targets.tvm.importable.rules.base import MatchResult, NodeRule, attr, constant, dtype, np_dtype, shape


class TfIdfVectorizer(NodeRule):
    """TfIdfVectorizer with ``pool_int64s`` over [C] or [B, C] integers (onnx's reference's counting).

    An n-gram at skip distance s starting at p is ``x[p], x[p + s], ..., x[p + (n - 1) s]``; n-grams of
    2 or more items count at every skip 1 .. max_skip_count + 1, single items once. Per (n, s): a
    Gather of every window [B, L, n], Equal against the pool's n-grams [G, n], all-of over n, summed
    over the L windows; a 0/1 MatMul puts each pool n-gram's count at its ``ngram_indexes`` slot.
    """

    report_name, ops = "tfidf_vectorizer", ("TfIdfVectorizer",)

    def check_node(self, node: ir.Node) -> MatchResult:
        given = shape(node.inputs[0])
        if given is None or len(given) not in (1, 2) or not attr(node, "pool_int64s"):
            return MatchResult().fail("not integer tokens (pool_int64s) in [C] or [B, C] of static size")
        if dtype(node.inputs[0]) is None or np.dtype(np_dtype(node.inputs[0])).kind not in "iu":
            return MatchResult().fail("not integer tokens")
        columns, skips = given[-1], int(attr(node, "max_skip_count", 0)) + 1
        if not any(columns - (n - 1) * s > 0 for n in _pool(node) for s in (range(1, skips + 1) if n > 1 else [1])):
            return MatchResult().fail("no n-gram fits the row")
        return MatchResult()

    def rewrite_node(self, op: Any, node: ir.Node) -> Any:
        given = shape(node.inputs[0])
        assert given is not None  # checked
        grams = _pool(node)
        width = int(max(attr(node, "ngram_indexes"))) + 1
        kind, columns = np_dtype(node.inputs[0]), given[-1]
        x = node.inputs[0]
        if len(given) == 1:
            x = self.axes_op(op, "Unsqueeze", [x], [0])
        total = None
        for n, (pool, slots) in grams.items():
            mapping = np.zeros((len(pool), width), np.float32)
            mapping[np.arange(len(pool)), slots] = 1
            for s in range(1, int(attr(node, "max_skip_count", 0)) + 2) if n > 1 else [1]:
                length = columns - (n - 1) * s
                if length <= 0:
                    continue
                index = np.arange(length)[:, None] + s * np.arange(n)[None, :]
                win = op.Gather(x, constant(op, index.astype(np.int64)), axis=1)  # [B, L, n]
                win4 = self.axes_op(op, "Unsqueeze", [win], [2])  # [B, L, 1, n] (no negative axes before opset 11)
                hit = op.Cast(op.Equal(win4, constant(op, pool.astype(kind))), to=onnx.TensorProto.INT32)
                every = self.axes_op(op, "ReduceMin", [hit], [3], keepdims=0)  # [B, L, G]
                counts = self.axes_op(op, "ReduceSum", [every], [1], keepdims=0)  # [B, G]
                placed = op.MatMul(op.Cast(counts, to=onnx.TensorProto.FLOAT), constant(op, mapping))  # [B, width]
                total = placed if total is None else op.Add(total, placed)
        return _weighted(op, node, total, len(given) == 1, width)


def _pool(node: ir.Node) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """n -> (the pool's n-grams [G, n], their output slots [G]) for n in [min_gram_length, max_gram_length]."""
    pool, starts = list(attr(node, "pool_int64s")), list(attr(node, "ngram_counts"))
    indexes = list(attr(node, "ngram_indexes"))
    low, high = int(attr(node, "min_gram_length")), int(attr(node, "max_gram_length"))
    grams, first = {}, 0
    for k, start in enumerate(starts):
        n = k + 1
        end = starts[k + 1] if k + 1 < len(starts) else len(pool)
        count = (end - start) // n
        if count and low <= n <= high:
            items = np.array(pool[start : start + count * n], np.int64).reshape(count, n)
            grams[n] = (items, np.array(indexes[first : first + count], np.int64))
        first += count
    return grams


def _weighted(op: Any, node: ir.Node, counts: Any, one_row: bool, width: int) -> Any:
    """TF: the counts; IDF: the weight (or 1) where a count is above 0; TFIDF: count times weight (or 1)."""
    mode = attr(node, "mode", "TF")
    weights = np.array(attr(node, "weights", []) or np.ones(width), np.float32)
    y = counts
    if mode != "TF":
        w = constant(op, weights)
        if mode == "IDF":
            zero = constant(op, np.array(0, np.float32))
            y = op.Where(op.Greater(counts, zero), w, zero)
        else:
            y = op.Mul(counts, w)
    if one_row:
        return op.Reshape(y, constant(op, np.array([width], np.int64)))
    return op.Identity(y)
