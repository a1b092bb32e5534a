# mypy: disable-error-code="valid-type"
# (TVMScript buffer annotations are calls, which mypy cannot read as types.)
"""One decode step's attention over the filled part of a static KV cache.

``out[b, h] = softmax(scale * q[b, h] . k[b, g, :n]) @ v[b, g, :n]`` with ``n = pos[b] + 1`` (the
slot's length, its new token included) and ``g = h // (heads / kv_heads)`` (grouped-query
attention reads the cache's head as stored, never expanded). The graph's own version multiplies
against all ``max_seq_len`` positions, copies the cache once per query head, and masks the
unfilled tail; this reads ``n`` positions. One (slot, head) per parallel task; the dot products
and the weighted sum run on 16-lane vectors.
"""

from __future__ import annotations

from typing import Any

LANES = 16


def supports(head_dim: int) -> str:
    return "" if head_dim % LANES == 0 else f"head_dim {head_dim} is not a multiple of {LANES}"


def decode_attention(batch: int, heads: int, kv_heads: int, seq: int, dim: int, scale: float) -> Any:
    """The scheduled PrimFunc ``(q [b, h, 1, d], k [b, kv, s, d], v [b, kv, s, d], pos [b]) -> out [b, h, 1, d]``."""
    from tvm.script import tirx as T

    b_, h_, kv_, s_, d_ = (T.int64(n) for n in (batch, heads, kv_heads, seq, dim))
    one, rep, chunks = T.int64(1), T.int64(heads // kv_heads), dim // LANES

    @T.prim_func(private=True, s_tir=True)
    def kernel(
        q: T.Buffer((b_, h_, one, d_), "float32"),
        k: T.Buffer((b_, kv_, s_, d_), "float32"),
        v: T.Buffer((b_, kv_, s_, d_), "float32"),
        pos: T.Buffer((b_,), "int64"),
        out: T.Buffer((b_, h_, one, d_), "float32"),
    ) -> None:
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": 8})
        for bh in T.parallel(b_ * h_):
            b = bh // h_
            g = bh % h_ // rep
            n = T.min(T.max(pos[b] + T.int64(1), one), s_)
            scores = T.decl_buffer((s_,), "float32")
            lanes = T.decl_buffer((LANES,), "float32")
            acc = T.decl_buffer((d_,), "float32")
            top = T.decl_buffer((1,), "float32")
            total = T.decl_buffer((1,), "float32")
            top[0] = T.float32(-3.0e38)
            for t in range(n):
                for lane in T.vectorized(LANES):
                    lanes[lane] = T.float32(0)
                for c in range(chunks):
                    for lane in T.vectorized(LANES):
                        lanes[lane] = lanes[lane] + q[b, bh % h_, 0, c * LANES + lane] * k[b, g, t, c * LANES + lane]
                scores[t] = T.float32(0)
                for lane in range(LANES):
                    scores[t] = scores[t] + lanes[lane]
                scores[t] = scores[t] * T.float32(scale)
                top[0] = T.max(top[0], scores[t])
            total[0] = T.float32(0)
            for t in range(n):
                scores[t] = T.exp(scores[t] - top[0])
                total[0] = total[0] + scores[t]
            for d in T.vectorized(d_):
                acc[d] = T.float32(0)
            for t in range(n):
                for d in T.vectorized(d_):
                    acc[d] = acc[d] + scores[t] * v[b, g, t, d]
            for d in T.vectorized(d_):
                out[b, bh % h_, 0, d] = acc[d] / total[0]

    return kernel
