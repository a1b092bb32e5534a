# mypy: disable-error-code="valid-type"
# (TVMScript buffer annotations are calls, which mypy cannot read as types.)
"""One decode (or verify) step's attention over the filled part of a static KV cache.

``out[b, h, i] = softmax(scale * q[b, h, i] . k[b, g, :n]) @ v[b, g, :n]`` with ``n = pos[b] + i + 1``
(query ``i`` of a slot's ``width`` sits at ``pos[b] + i`` and sees the cache up to itself: a decode
step's one token, or a verify step's ``width`` written at ``pos[b] ..``) and
``g = h // (heads / kv_heads)`` (grouped-query attention reads the cache's head as stored, never
expanded). The graph's own version multiplies
against all ``max_seq_len`` positions, copies the cache once per query head, and masks the
unfilled tail; this reads ``n`` positions. One (slot, head, query) per parallel task; the dot products
(their 16 lanes added as a tree), the maximum, the exponentials and the weighted sum run on
16-lane vectors. The exponential is Cephes' polynomial (what TVM's ``fast_exp`` computes, ~1e-7
relative error) written out: the intrinsic ``exp`` is a scalar ``expf`` call per position.
A step's weights pass through the last-level cache between two layers' attention, so the cache rows
come from memory, one sequential run per task (K, then V): the dot products' loop prefetches the V
row it will weigh and the K row ``PREFETCH_K`` positions ahead, so the task keeps more misses in
flight.
"""

from __future__ import annotations

from typing import Any

LANES = 16
#: How many positions ahead the dot products' loop prefetches the K cache (4 lines a 64-wide row).
PREFETCH_K = 8
#: what a decode attention PrimFunc carries for ``rewrites/paged_kv``, which reads the same attention through a
#: block table: ``[scale, width]``
ATTENTION_ATTR = "aotforge_attention"


def _add(a: Any, b: Any) -> Any:
    return a + b


def supports(head_dim: int) -> str:
    return "" if head_dim % LANES == 0 else f"head_dim {head_dim} is not a multiple of {LANES}"


def _padded(seq: int) -> Any:
    """The scores buffer in whole vectors: the positions past a sequence's length hold -3e38 (exp -> 0)."""
    from tvm.script import tirx as T

    return T.int64((seq + LANES - 1) // LANES * LANES)


def _softmax(padded: Any) -> Any:
    """The macro ``softmax(scores, n, top, total, xs, ns)``: ``scores[:n]`` become their exponentials less the
    maximum (``scores[n:]`` zero) and ``total[0]`` their sum; the rest are 16-lane scratch buffers."""
    from tvm.script import tirx as T

    @T.macro
    def fold_lanes(buf: T.Buffer, combine: Any) -> None:
        """``buf[0] = combine`` over its 16 lanes, halving the vector each step (8, 4, 2 lanes, then 1)."""
        for lane in T.vectorized(8):
            buf[lane] = combine(buf[lane], buf[lane + 8])
        for lane in T.vectorized(4):
            buf[lane] = combine(buf[lane], buf[lane + 4])
        for lane in T.vectorized(2):
            buf[lane] = combine(buf[lane], buf[lane + 2])
        buf[0] = combine(buf[0], buf[1])

    @T.macro
    def softmax(scores: T.Buffer, n: Any, top: T.Buffer, total: T.Buffer, xs: T.Buffer, ns: T.Buffer) -> None:
        for t in range(n, padded):
            scores[t] = T.float32(-3.0e38)
        for lane in T.vectorized(LANES):
            top[lane] = scores[lane]
        for blk in range(1, (n + LANES - 1) // LANES):
            for lane in T.vectorized(LANES):
                top[lane] = T.max(top[lane], scores[blk * LANES + lane])
        fold_lanes(top, T.max)
        for lane in T.vectorized(LANES):
            total[lane] = T.float32(0)
        for blk in range((n + LANES - 1) // LANES):
            for lane in T.vectorized(LANES):
                xs[lane] = T.max(scores[blk * LANES + lane] - top[0], T.float32(-88.0))
            for lane in T.vectorized(LANES):
                ns[lane] = T.floor(xs[lane] * T.float32(1.4426950408889634) + T.float32(0.5))
            for lane in T.vectorized(LANES):
                xs[lane] = xs[lane] - ns[lane] * T.float32(0.6931471805599453)
            for lane in T.vectorized(LANES):
                # exp(x) for x <= 0 (Cephes' polynomial, as TVM's fast_exp): 2^n p(r), x = n ln 2 + r
                scores[blk * LANES + lane] = T.reinterpret(
                    "float32", T.shift_left(T.Cast("int32", ns[lane]) + 127, 23)
                ) * (
                    (
                        (
                            (
                                (
                                    (T.float32(1.9875691500e-4) * xs[lane] + T.float32(1.3981999507e-3)) * xs[lane]
                                    + T.float32(8.3334519073e-3)
                                )
                                * xs[lane]
                                + T.float32(4.1665795894e-2)
                            )
                            * xs[lane]
                            + T.float32(1.6666665459e-1)
                        )
                        * xs[lane]
                        + T.float32(5.0000001201e-1)
                    )
                    * xs[lane]
                    * xs[lane]
                    + xs[lane]
                    + T.float32(1.0)
                )
            for lane in T.vectorized(LANES):
                total[lane] = total[lane] + scores[blk * LANES + lane]
        fold_lanes(total, _add)

    return softmax


def decode_attention(batch: int, heads: int, kv_heads: int, seq: int, dim: int, scale: float, width: int = 1) -> Any:
    """The scheduled PrimFunc ``(q [b, h, w, d], k [b, kv, s, d], v [b, kv, s, d], pos [b]) -> out [b, h, w, d]``."""
    from tvm.script import tirx as T

    b_, h_, kv_, s_, d_, w_ = (T.int64(n) for n in (batch, heads, kv_heads, seq, dim, width))
    one, rep, chunks = T.int64(1), T.int64(heads // kv_heads), dim // LANES
    padded = _padded(seq)
    softmax = _softmax(padded)

    @T.macro
    def prefetch(cache: T.Buffer, b: Any, g: Any, t: Any) -> None:
        """Ask for the cache lines of row ``cache[b, g, t]`` ahead of its use (read, keep in all levels)."""
        for c in T.unroll(chunks):
            T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(cache[b, g, t, c * LANES]), 0, 3, 1))

    @T.prim_func(private=True, s_tir=True)
    def kernel(
        q: T.Buffer((b_, h_, w_, d_), "float32"),
        k: T.Buffer((b_, kv_, s_, d_), "float32"),
        v: T.Buffer((b_, kv_, s_, d_), "float32"),
        pos: T.Buffer((b_,), "int64"),
        out: T.Buffer((b_, h_, w_, d_), "float32"),
    ) -> None:
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": 8})
        for bhi in T.parallel(b_ * h_ * w_):
            bh = bhi // w_
            i = bhi % w_
            b = bh // h_
            g = bh % h_ // rep
            n = T.min(T.max(pos[b] + i + one, one), s_)
            scores = T.decl_buffer((padded,), "float32")
            lanes = T.decl_buffer((LANES,), "float32")
            acc = T.decl_buffer((d_,), "float32")
            top = T.decl_buffer((LANES,), "float32")
            total = T.decl_buffer((LANES,), "float32")
            xs = T.decl_buffer((LANES,), "float32")
            ns = T.decl_buffer((LANES,), "float32")
            for t in range(n):
                prefetch(v, b, g, t)
                prefetch(k, b, g, T.min(t + T.int64(PREFETCH_K), n - one))
                for lane in T.vectorized(LANES):
                    lanes[lane] = q[b, bh % h_, i, lane] * k[b, g, t, lane]
                for c in range(1, chunks):
                    for lane in T.vectorized(LANES):
                        lanes[lane] = lanes[lane] + q[b, bh % h_, i, c * LANES + lane] * k[b, g, t, c * LANES + lane]
                for lane in T.vectorized(8):
                    lanes[lane] = lanes[lane] + lanes[lane + 8]
                for lane in T.vectorized(4):
                    lanes[lane] = lanes[lane] + lanes[lane + 4]
                for lane in T.vectorized(2):
                    lanes[lane] = lanes[lane] + lanes[lane + 2]
                scores[t] = (lanes[0] + lanes[1]) * T.float32(scale)
            softmax(scores, n, top, total, xs, ns)
            for d in T.vectorized(d_):
                acc[d] = T.float32(0)
            for t in range(n):
                for d in T.vectorized(d_):
                    acc[d] = acc[d] + scores[t] * v[b, g, t, d]
            for d in T.vectorized(d_):
                out[b, bh % h_, i, d] = acc[d] / total[0]

    return kernel


def paged_decode_attention(heads: int, kv_heads: int, seq: int, dim: int, scale: float, width: int = 1) -> Any:
    """The same attention over a paged cache: ``(q [b, h, w, d], k [blocks, kv, block_size, d], v (as k),
    table [b, table_width], pos [b]) -> out [b, h, w, d]``, position ``t`` of row ``b`` read at
    ``k[table[b, t // block_size], g, t % block_size]``. The batch, the pool's blocks, the block size and
    the table's width are the call's (symbolic); ``seq`` bounds the positions a row may read."""
    from tvm.script import tirx as T

    h_, kv_, s_, d_, w_ = (T.int64(n) for n in (heads, kv_heads, seq, dim, width))
    one, rep, chunks = T.int64(1), T.int64(heads // kv_heads), dim // LANES
    padded = _padded(seq)
    softmax = _softmax(padded)

    @T.macro
    def prefetch(cache: T.Buffer, blk: Any, g: Any, t: Any) -> None:
        for c in T.unroll(chunks):
            T.evaluate(
                T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(cache[blk, g, t, c * LANES]), 0, 3, 1)
            )

    @T.prim_func(private=True, s_tir=True)
    def kernel(
        q_h: T.handle, k_h: T.handle, v_h: T.handle, table_h: T.handle, pos_h: T.handle, out_h: T.handle
    ) -> None:
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": 8})
        b_, nb_, bs_, tw_ = T.int64(), T.int64(), T.int64(), T.int64()
        q = T.match_buffer(q_h, (b_, h_, w_, d_), "float32")
        k = T.match_buffer(k_h, (nb_, kv_, bs_, d_), "float32")
        v = T.match_buffer(v_h, (nb_, kv_, bs_, d_), "float32")
        table = T.match_buffer(table_h, (b_, tw_), "int64")
        pos = T.match_buffer(pos_h, (b_,), "int64")
        out = T.match_buffer(out_h, (b_, h_, w_, d_), "float32")
        for bhi in T.parallel(b_ * h_ * w_):
            bh = bhi // w_
            i = bhi % w_
            b = bh // h_
            g = bh % h_ // rep
            n = T.min(T.min(T.max(pos[b] + i + one, one), s_), tw_ * bs_)
            scores = T.decl_buffer((padded,), "float32")
            lanes = T.decl_buffer((LANES,), "float32")
            acc = T.decl_buffer((d_,), "float32")
            top = T.decl_buffer((LANES,), "float32")
            total = T.decl_buffer((LANES,), "float32")
            xs = T.decl_buffer((LANES,), "float32")
            ns = T.decl_buffer((LANES,), "float32")
            for j in range((n + bs_ - one) // bs_):
                blk = table[b, j]
                for o in range(T.min(bs_, n - j * bs_)):
                    prefetch(v, blk, g, o)
                    prefetch(k, blk, g, T.min(o + T.int64(PREFETCH_K), bs_ - one))
                    for lane in T.vectorized(LANES):
                        lanes[lane] = q[b, bh % h_, i, lane] * k[blk, g, o, lane]
                    for c in range(1, chunks):
                        for lane in T.vectorized(LANES):
                            lanes[lane] = (
                                lanes[lane] + q[b, bh % h_, i, c * LANES + lane] * k[blk, g, o, c * LANES + lane]
                            )
                    for lane in T.vectorized(8):
                        lanes[lane] = lanes[lane] + lanes[lane + 8]
                    for lane in T.vectorized(4):
                        lanes[lane] = lanes[lane] + lanes[lane + 4]
                    for lane in T.vectorized(2):
                        lanes[lane] = lanes[lane] + lanes[lane + 2]
                    scores[j * bs_ + o] = (lanes[0] + lanes[1]) * T.float32(scale)
            softmax(scores, n, top, total, xs, ns)
            for d in T.vectorized(d_):
                acc[d] = T.float32(0)
            for j in range((n + bs_ - one) // bs_):
                blk = table[b, j]
                for o in range(T.min(bs_, n - j * bs_)):
                    for d in T.vectorized(d_):
                        acc[d] = acc[d] + scores[j * bs_ + o] * v[blk, g, o, d]
            for d in T.vectorized(d_):
                out[b, bh % h_, i, d] = acc[d] / total[0]

    return kernel


def paged_write(kv_heads: int, dim: int, width: int = 1) -> Any:
    """``cache[table[b, p // block_size], h, p % block_size] = update[b, h, t]`` with ``p = pos[b] + t``, in place
    (a scheduled PrimFunc): a step's new keys or values into the blocks of each row's table. ``p`` is clamped to
    the table, so a bad position never writes outside the pool."""
    from tvm.script import tirx as T

    kv_, d_, w_ = (T.int64(n) for n in (kv_heads, dim, width))
    zero, one = T.int64(0), T.int64(1)

    @T.prim_func(private=True, s_tir=True)
    def kernel(cache_h: T.handle, table_h: T.handle, pos_h: T.handle, update_h: T.handle) -> None:
        # op_pattern 8 (opaque): FuseOps leaves the call alone, as the in-place write must be.
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": 8})
        b_, nb_, bs_, tw_ = T.int64(), T.int64(), T.int64(), T.int64()
        cache = T.match_buffer(cache_h, (nb_, kv_, bs_, d_), "float32")
        table = T.match_buffer(table_h, (b_, tw_), "int64")
        pos = T.match_buffer(pos_h, (b_,), "int64")
        update = T.match_buffer(update_h, (b_, kv_, w_, d_), "float32")
        for i, j, t in T.grid(b_, kv_, w_):
            p = T.min(T.max(pos[i] + t, zero), tw_ * bs_ - one)
            blk = T.min(T.max(table[i, p // bs_], zero), nb_ - one)
            for k in T.vectorized(d_):
                cache[blk, j, p % bs_, k] = update[i, j, t, k]

    return kernel
