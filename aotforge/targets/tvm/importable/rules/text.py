"""TfIdfVectorizer over integer tokens with a static row length, as window comparisons and sums."""

from __future__ import annotations

import numpy as np
import onnx

from aotforge.targets.tvm.importable.rules.base import Graph, attr, make


def tfidf_vectorizer(node: onnx.NodeProto, g: Graph) -> list[onnx.NodeProto] | None:
    """TfIdfVectorizer with ``pool_int64s`` over [C] or [B, C] integers (onnx's reference's counting).

    An n-gram at skip distance s starting at p is ``x[p], x[p + s], ..., x[p + (n - 1) s]``; n-grams of
    2 or more items count at every skip 1 .. max_skip_count + 1, single items once. Per (n, s): a
    Gather of every window [B, L, n], Equal against the pool's n-grams [G, n], all-of over n, summed
    over the L windows; a 0/1 MatMul puts each pool n-gram's count at its ``ngram_indexes`` slot.
    """
    shape = g.shapes.get(node.input[0])
    if node.op_type != "TfIdfVectorizer" or shape is None or len(shape) not in (1, 2) or not attr(node, "pool_int64s"):
        return None
    if node.input[0] not in g.dtypes or g.np_dtype(node.input[0]).kind not in "iu":
        return None
    grams = _pool(node)
    width = int(max(attr(node, "ngram_indexes"))) + 1
    out, dtype = node.output[0], g.np_dtype(node.input[0])
    columns = shape[-1]
    nodes: list[onnx.NodeProto] = []
    x = node.input[0]
    if len(shape) == 1:
        x = g.fresh(f"{out}_rows")
        nodes += g.axes_op("Unsqueeze", [node.input[0]], [x], [0])
    total = ""
    for n, (pool, slots) in grams.items():
        mapping = np.zeros((len(pool), width), np.float32)
        mapping[np.arange(len(pool)), slots] = 1
        for s in range(1, int(attr(node, "max_skip_count", 0)) + 2) if n > 1 else [1]:
            length = columns - (n - 1) * s
            if length <= 0:
                continue
            index = np.arange(length)[:, None] + s * np.arange(n)[None, :]
            idx, idx_node = g.constant("tfidf_index", index.astype(np.int64))
            pool_name, pool_node = g.constant("tfidf_pool", pool.astype(dtype))
            map_name, map_node = g.constant("tfidf_map", mapping)
            win, win4, hit, hit8, every, counts, counts_f, placed = (
                g.fresh(f"{out}_n{n}s{s}_{k}") for k in ("win", "win4", "eq", "u8", "all", "count", "f", "placed")
            )
            nodes += [
                idx_node, pool_node, map_node,
                make("Gather", [x, idx], [win], axis=1),  # [B, L, n]
                *g.axes_op("Unsqueeze", [win], [win4], [2]),  # [B, L, 1, n] (no negative axes before opset 11)
                make("Equal", [win4, pool_name], [hit]),  # [B, L, G, n]
                make("Cast", [hit], [hit8], to=onnx.TensorProto.INT32),
                *g.axes_op("ReduceMin", [hit8], [every], [3], keepdims=0),  # [B, L, G]
                *g.axes_op("ReduceSum", [every], [counts], [1], keepdims=0),  # [B, G]
                make("Cast", [counts], [counts_f], to=onnx.TensorProto.FLOAT),
                make("MatMul", [counts_f, map_name], [placed]),  # [B, width]
            ]  # fmt: skip
            if total:
                summed = g.fresh(f"{out}_sum")
                nodes.append(make("Add", [total, placed], [summed]))
                total = summed
            else:
                total = placed
    if not total:
        return None
    return nodes + _weighted(node, g, total, len(shape) == 1, width)


def _pool(node: onnx.NodeProto) -> dict[int, tuple[np.ndarray, np.ndarray]]:
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


def _weighted(node: onnx.NodeProto, g: Graph, counts: str, one_row: bool, width: int) -> list[onnx.NodeProto]:
    """TF: the counts; IDF: the weight (or 1) where a count is above 0; TFIDF: count times weight (or 1)."""
    mode, out = attr(node, "mode", b"TF"), node.output[0]
    weights = np.array(attr(node, "weights", []) or np.ones(width), np.float32)
    nodes, y = [], counts
    if mode != b"TF":
        w, w_node = g.constant("tfidf_weights", weights)
        nodes.append(w_node)
        if mode == b"IDF":
            zero, zero_node = g.constant("tfidf_zero", np.array(0, np.float32))
            seen, y = g.fresh(f"{out}_seen"), g.fresh(f"{out}_idf")
            nodes += [zero_node, make("Greater", [counts, zero], [seen]), make("Where", [seen, w, zero], [y])]
        else:
            y = g.fresh(f"{out}_tfidf")
            nodes.append(make("Mul", [counts, w], [y]))
    if one_row:
        shape, shape_node = g.constant("tfidf_shape", np.array([width], np.int64))
        return [*nodes, shape_node, make("Reshape", [y, shape], [out])]
    return [*nodes, make("Identity", [y], [out])]
