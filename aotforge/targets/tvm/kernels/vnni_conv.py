"""A u8 x s8 -> i32 NHWC convolution on AVX-512 VNNI, reading the padded input in place.

An implicit GEMM: output pixels are the rows, ``(kh, kw, c)`` the reduction, output channels
the columns. With channels last and ``C`` a multiple of 4, the 4 activation bytes one
``vpdpbusd`` broadcasts are contiguous in the input, so no im2col matrix (9x the activation
for a 3x3 kernel) is ever written. Tiles as ``vnni_dense``: 8 output pixels along a row by
3 x 16 output channels of int32 accumulators; the zero-point correction rides the write-back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import s_tir, te

from aotforge.targets.tvm.kernels import requantize
from aotforge.targets.tvm.kernels.vnni_dense import (
    GROUP,
    LANES,
    TILE_M,
    TILE_N_VECTORS,
    finish_tile,
    largest_divisor,
    register_intrinsic,
)


def pack_weight(w: np.ndarray, channels: int) -> np.ndarray:
    """``[O, C, KH, KW]`` int8 -> ``[O/16, KH*KW*C'/4, 16, 4]`` (``C'`` = ``channels``, zero-padded)."""
    o, c, kh, kw = w.shape
    hwio = np.zeros((kh, kw, channels, o), np.int8)
    hwio[:, :, :c, :] = w.transpose(2, 3, 1, 0)
    k = kh * kw * channels
    return np.ascontiguousarray(hwio.reshape(k // GROUP, GROUP, o // LANES, LANES).transpose(2, 0, 3, 1))


def conv2d_u8s8(
    n: int,
    h: int,
    w: int,
    c: int,
    o: int,
    kh: int,
    kw: int,
    strides: tuple[int, int],
    out_hw: tuple[int, int],
    out_dtype: str = "int32",
) -> Any:
    """The scheduled PrimFunc ``(x u8[n,h,w,c] (padded), w_packed, za u8[], colsum i32[o]) -> i32[n,oh,ow,o]``;
    with an 8-bit ``out_dtype``, a ``requantize`` table ``f32[4, o]`` follows ``colsum`` and the
    write-back requantizes (``kernels.requantize``)."""
    register_intrinsic()
    oh, ow = out_hw
    sh, sw = strides
    x = te.placeholder((n, h, w, c), "uint8", name="x")
    wp = te.placeholder((o // LANES, kh * kw * c // GROUP, LANES, GROUP), "int8", name="w_packed")
    za = te.placeholder((), "uint8", name="za")
    colsum = te.placeholder((o,), "int32", name="colsum")
    ry, rx, rc = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx"), te.reduce_axis((0, c), "rc")

    def dot(b: Any, y: Any, xx: Any, j: Any) -> Any:
        k = (ry * kw + rx) * c + rc
        a = x[b, y * sh + ry, xx * sw + rx, rc].astype("int32")
        return te.sum(a * wp[j // LANES, k // GROUP, j % LANES, k % GROUP].astype("int32"), axis=[ry, rx, rc])

    acc = te.compute((n, oh, ow, o), dot, name="acc")
    table = requantize.placeholder(o)

    def corrected(b: Any, y: Any, xx: Any, j: Any) -> Any:
        value = acc[b, y, xx, j] - za[()].astype("int32") * colsum[j]
        return value if out_dtype == "int32" else requantize.apply(value, table, j, out_dtype)

    out = te.compute((n, oh, ow, o), corrected)
    params = [x, wp, za, colsum, *([] if out_dtype == "int32" else [table]), out]
    sch = s_tir.Schedule(te.create_prim_func(params))
    block = sch.get_sblock("acc")
    b, y, xx, j, ry_l, rx_l, rc_l = sch.get_loops(block)
    jv, jl = sch.split(j, [None, LANES])
    co, ci = sch.split(rc_l, [None, GROUP])
    xo, xi = sch.split(xx, [None, largest_divisor(ow, TILE_M)])
    jo, ji = sch.split(jv, [None, largest_divisor(o // LANES, TILE_N_VECTORS)])
    sch.reorder(jo, b, y, xo, ry_l, rx_l, co, xi, ji, jl, ci)
    epilogue = sch.get_sblock(out.op.name)
    return finish_tile(sch, block, epilogue, parallel=[jo, b, y, xo], reduction=ry_l, lanes=jl, tile=[xi, ji])
