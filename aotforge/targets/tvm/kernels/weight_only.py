# mypy: disable-error-code="valid-type"
# (TVMScript buffer annotations are calls, which mypy cannot read as types.)
"""Weight-only int4 / int8 matmuls on AVX-512 VNNI: weights packed at compile time, activations quantized per call.

``out[m, n] = sum_k x[m, k] * w[k, n]`` where ``w`` is stored as integers with scales:

- int4: ``q[n, k]`` in [-8, 7] with one fp32 scale per ``group`` values along K (``quantize_int4``,
  ONNX Runtime's rounding), two 4-bit values a byte, stored as ``q + 8``;
- int8: ``q[n, k]`` in [-127, 127] with one fp32 scale per output channel (``quantize_int8``),
  stored as ``q + 128``.

Packed layout: ``[N/16, K/8, 16, 4]`` bytes for int4 (byte ``(b, r, lane, j)`` holds ``k = 8r + j`` in
its low nibble and ``8r + 4 + j`` in its high one) and ``[N/16, K/4, 16, 4]`` for int8: each 64 bytes
are one ``vpdpbusd`` operand for 16 output columns. Int4 scales are float16 ``[N/16, K/group, 16]`` (a
tenth of what a decode step streams at group 32 instead of a fifth); int8 scales float32 ``[N]``.

The kernel quantizes each row of ``x`` per block of ``group`` values to int8 (symmetric, scale
``max|x| / 127``) and keeps the sum of the block's integers. ``vpdpbusd`` multiplies unsigned by
signed bytes: the *weights* are the unsigned side (nibble or ``q + 128``: no unpacking beyond a mask
and a shift) and the activations, broadcast, the signed one. The weight offset ``z`` (8 or 128)
comes back per block as ``z * sum(xq)`` (one scalar per row and block, never per column):
``acc += (float(dot) * s_x - z * sum(xq) * s_x) * s_w``. The weights are read once per row tile
and never widened in memory: what a memory-bound decode step streams is 4 or 8 bits a weight.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aotforge.targets.tvm.kernels.vnni_dense import largest_divisor

LANES = 16
GROUPS = (32, 64, 128)
#: 16-lane column blocks per parallel task, and rows per tile (accumulators: 2 x NB x MT zmm).
BLOCKS_PER_TASK = 4
ROW_TILE = 4


def supports(k: int, n: int, bits: int, group: int) -> str:
    """Why the packed kernel cannot take a ``[K, N]`` weight ('' when it can)."""
    if n % LANES:
        return f"N={n} is not a multiple of {LANES}"
    if k % group:
        return f"K={k} is not a multiple of the group {group}"
    return ""


def check_format(bits: int, group: int) -> None:
    from aotforge.core.errors import OptionsError

    if bits not in (4, 8):
        raise OptionsError(f"tvm weight-only: bits is 4 or 8, got {bits}")
    if group not in GROUPS:
        raise OptionsError(f"tvm weight-only: block_size is one of {', '.join(map(str, GROUPS))}, got {group}")


def quantize_int4(w_nk: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """``[N, K]`` float -> ``q`` int8 in [-8, 7] and ``scales [N, K/group]`` (round to nearest, symmetric)."""
    n, k = w_nk.shape
    if k % group:
        raise ValueError(f"K={k} is not a multiple of the group {group}")
    blocks = w_nk.astype(np.float32).reshape(n, k // group, group)
    # As ONNX Runtime's blockwise quantizer: the value of largest magnitude maps to -8 (scale may be
    # negative), so all 16 levels are used and the step is max|w| / 8, not / 7.
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
    # Scales are stored as float16: quantize against the stored value (one too small for float16 -> 1).
    scales = np.where(extreme != 0, extreme / -8.0, 1.0).astype(np.float16).astype(np.float32)
    scales[scales == 0] = 1.0
    q = np.clip(np.rint(blocks / scales[:, :, None]), -8, 7).astype(np.int8)
    return q.reshape(n, k), scales


def quantize_int8(w_nk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[N, K]`` float -> ``q`` int8 in [-127, 127] and one scale per output channel ``[N]``."""
    amax = np.abs(w_nk.astype(np.float32)).max(axis=1)
    scales = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w_nk / scales[:, None]), -127, 127).astype(np.int8)
    return q, scales


def pack(w_nk: np.ndarray, bits: int, group: int) -> tuple[np.ndarray, np.ndarray]:
    """``[N, K]`` float -> (packed bytes, scales) as the kernel reads them."""
    n, k = w_nk.shape
    why = supports(k, n, bits, group)
    if why:
        raise ValueError(why)
    if bits == 8:
        q, scales = quantize_int8(w_nk)
        u = (q.astype(np.int16) + 128).astype(np.uint8)
        return np.ascontiguousarray(u.reshape(n // LANES, LANES, k // 4, 4).transpose(0, 2, 1, 3)), scales
    q, scales = quantize_int4(w_nk, group)
    u = (q.astype(np.int16) + 8).astype(np.uint8).reshape(n // LANES, LANES, k // 8, 2, 4)
    packed = u[:, :, :, 0, :] | (u[:, :, :, 1, :] << 4)
    s = scales.astype(np.float16).reshape(n // LANES, LANES, k // group).transpose(0, 2, 1)
    return np.ascontiguousarray(packed.transpose(0, 2, 1, 3)), np.ascontiguousarray(s)


def unpack(packed: np.ndarray, scales: np.ndarray, bits: int, group: int) -> np.ndarray:
    """The dequantized ``[N, K]`` float32 weight of ``pack``'s output."""
    nb, kr, _, _ = packed.shape
    n = nb * LANES
    if bits == 8:
        k = kr * 4
        q = packed.transpose(0, 2, 1, 3).reshape(n, k).astype(np.float32) - 128
        return q * scales[:, None]
    k = kr * 8
    by = packed.transpose(0, 2, 1, 3)  # [N/16, 16, K/8, 4]
    u = np.stack([by & 15, by >> 4], axis=3).reshape(n, k).astype(np.float32) - 8
    s = scales.astype(np.float32).transpose(0, 2, 1).reshape(n, k // group)
    return (u.reshape(n, k // group, group) * s[:, :, None]).reshape(n, k)


def packed_shapes(k: int, n: int, bits: int, group: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if bits == 8:
        return (n // LANES, k // 4, LANES, 4), (n,)
    return (n // LANES, k // 8, LANES, 4), (n // LANES, k // group, LANES)


def reference(x: np.ndarray, packed: np.ndarray, scales: np.ndarray, bits: int, group: int) -> np.ndarray:
    """What the kernel computes, in numpy: ``x`` quantized per block of ``group``, times the packed weight."""
    m, k = x.shape
    blocks = x.astype(np.float32).reshape(m, k // group, group)
    amax = np.abs(blocks).max(axis=2, keepdims=True)
    sx = amax / 127.0
    xq = np.rint(blocks * np.where(amax > 0, 127.0 / np.where(amax > 0, amax, 1), 0)).reshape(m, k)
    w = unpack(packed, scales, bits, group)  # [N, K]
    xd = (xq.reshape(m, k // group, group) * sx).reshape(m, k)
    return (xd.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)


def weight_only_matmul(m: int, k: int, n: int, bits: int, group: int) -> Any:
    """The scheduled PrimFunc ``(x f32[m, k], packed u8, scales f16 | f32) -> out f32[m, n]``."""
    from tvm.script import tirx as T

    qshape, sshape = packed_shapes(k, n, bits, group)
    blocks, per_byte_row = k // group, (8 if bits == 4 else 4)
    rows_per_block = group // per_byte_row
    nb_all = n // LANES
    nb = largest_divisor(nb_all, BLOCKS_PER_TASK)
    mt = largest_divisor(m, ROW_TILE)
    tasks_n, tasks_m = nb_all // nb, m // mt
    offset = 8.0 if bits == 4 else 128.0
    scale_dtype = "float16" if bits == 4 else "float32"
    i64 = T.int64
    xs, qs, ss, os_ = (tuple(i64(d) for d in shape) for shape in ((m, k), qshape, sshape, (m, n)))
    vpdpbusd = T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512")
    chunks = group // LANES

    def dot(acc: Any, base: Any, w: Any, xq: Any, row: Any, col: Any) -> Any:
        a = T.reinterpret(
            T.broadcast(T.reinterpret(xq.vload([row, col], "int8x4"), dtype="int32"), 16), dtype="int8x64"
        )
        return T.call_llvm_pure_intrin(vpdpbusd, acc.vload([base], "int32x16"), w, a, dtype="int32x16")

    @T.prim_func(private=True, s_tir=True)
    def kernel(
        x: T.Buffer(xs, "float32"),
        wq: T.Buffer(qs, "uint8"),
        ws: T.Buffer(ss, scale_dtype),
        out: T.Buffer(os_, "float32"),
    ) -> None:
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True, "op_pattern": 8})
        xq = T.alloc_buffer((i64(m), i64(k)), "int8")
        sx = T.alloc_buffer((i64(m), i64(blocks)), "float32")
        cx = T.alloc_buffer((i64(m), i64(blocks)), "float32")
        for r in T.parallel(i64(m)) if m >= 8 else T.serial(i64(m)):
            top = T.decl_buffer((LANES,), "float32")
            inv = T.decl_buffer((1,), "float32")
            total = T.decl_buffer((LANES,), "int32")
            for b in range(i64(blocks)):
                for ln in T.vectorized(LANES):
                    top[ln] = T.float32(0)
                for c in range(i64(chunks)):
                    for ln in T.vectorized(LANES):
                        top[ln] = T.max(top[ln], T.fabs(x[r, b * group + c * LANES + ln]))
                for ln in range(1, LANES):
                    top[0] = T.max(top[0], top[ln])
                inv[0] = T.if_then_else(top[0] > T.float32(0), T.float32(127) / top[0], T.float32(0))
                sx[r, b] = top[0] / T.float32(127)
                for ln in T.vectorized(LANES):
                    total[ln] = 0
                for c in range(i64(chunks)):
                    for ln in T.vectorized(LANES):
                        xq[r, b * group + c * LANES + ln] = T.Cast(
                            "int8", T.nearbyint(x[r, b * group + c * LANES + ln] * inv[0])
                        )
                        total[ln] = total[ln] + T.Cast("int32", xq[r, b * group + c * LANES + ln])
                for ln in range(1, LANES):
                    total[0] = total[0] + total[ln]
                cx[r, b] = T.Cast("float32", total[0]) * T.float32(offset) * sx[r, b]
        for task in T.parallel(i64(tasks_n * tasks_m)):
            tn = task % i64(tasks_n)
            tm = task // i64(tasks_n)
            acc = T.decl_buffer((mt * nb * LANES,), "float32")
            dots = T.decl_buffer((mt * nb * LANES,), "int32")
            for t in T.vectorized(mt * nb * LANES):
                acc[t] = T.float32(0)
            for b in range(i64(blocks)):
                for t in T.vectorized(mt * nb * LANES):
                    dots[t] = 0
                for kr in range(i64(rows_per_block)):
                    for j in T.unroll(nb):
                        if bits == 4:
                            w = wq.vload([tn * nb + j, b * rows_per_block + kr, 0, 0], "uint8x64")
                            lo = T.bitwise_and(w, T.broadcast(T.uint8(15), 64))
                            hi = T.shift_right(w, T.broadcast(T.uint8(4), 64))
                            for i in T.unroll(mt):
                                base = (i * nb + j) * LANES
                                col = b * group + kr * 8
                                dots[T.ramp(base, 1, 16)] = dot(dots, base, lo, xq, tm * mt + i, col)
                                dots[T.ramp(base, 1, 16)] = dot(dots, base, hi, xq, tm * mt + i, col + 4)
                        else:
                            w = wq.vload([tn * nb + j, b * rows_per_block + kr, 0, 0], "uint8x64")
                            for i in T.unroll(mt):
                                base = (i * nb + j) * LANES
                                col = b * group + kr * 4
                                dots[T.ramp(base, 1, 16)] = dot(dots, base, w, xq, tm * mt + i, col)
                for i in T.unroll(mt):
                    for j in T.unroll(nb):
                        for ln in T.vectorized(LANES):
                            if bits == 4:
                                acc[(i * nb + j) * LANES + ln] = acc[(i * nb + j) * LANES + ln] + (
                                    T.Cast("float32", dots[(i * nb + j) * LANES + ln]) * sx[tm * mt + i, b]
                                    - cx[tm * mt + i, b]
                                ) * T.Cast("float32", ws[tn * nb + j, b, ln])
                            else:
                                acc[(i * nb + j) * LANES + ln] = (
                                    acc[(i * nb + j) * LANES + ln]
                                    + T.Cast("float32", dots[(i * nb + j) * LANES + ln]) * sx[tm * mt + i, b]
                                    - cx[tm * mt + i, b]
                                )
            for i in T.unroll(mt):
                for j in T.unroll(nb):
                    for ln in T.vectorized(LANES):
                        if bits == 4:
                            out[tm * mt + i, (tn * nb + j) * LANES + ln] = acc[(i * nb + j) * LANES + ln]
                        else:
                            out[tm * mt + i, (tn * nb + j) * LANES + ln] = (
                                acc[(i * nb + j) * LANES + ln] * ws[(tn * nb + j) * LANES + ln]
                            )

    return kernel
