"""A u8 x s8 -> i32 NHWC depthwise convolution, vectorized over channels, reading the padded input in place.

The fallback of ``vnni_depthwise`` (which takes stride 1, or channels in multiples of 64): here any
multiple of 16 channels at any stride.

A depthwise convolution has ``KH * KW`` (9) products per output channel and none shared
between channels, so ``vpdpbusd``'s 4 consecutive reduction bytes would have to be gathered
from 4 taps of one channel (a byte transpose per 4 taps). With channels last, 16 consecutive
channels of one tap are 16 contiguous bytes instead: each input vector is one widening load
(shared by the taps of neighbouring output pixels), and each tap one multiply-add into 16 lanes.

The multiply-adds are fp32 FMAs on integer values, which is exact: every product and partial
sum is an integer below ``KH * KW * 255 * 128`` in magnitude, far under 2^24 for any window
this kernel takes (``supports``), and faster than ``vpmulld`` + ``vpaddd`` (two uops, one port,
10-cycle latency on Intel). The output is tiled as ``TILE_X`` pixels along a
row by 16 channels, whose accumulators stay in registers through the window; the write-back
turns them to int32 and subtracts the zero-point correction, as ``vnni_conv`` does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm import s_tir, te

from aotforge.targets.tvm.kernels import requantize
from aotforge.targets.tvm.kernels.nhwc_input import OPAQUE
from aotforge.targets.tvm.kernels.vnni_dense import LANES, STACK_BYTES, largest_divisor
from aotforge.targets.tvm.schedules.matmul import PARALLEL_MIN_MACS

#: fp32 holds every integer below this exactly.
EXACT_LIMIT = 2**24
#: Output pixels along a row per register tile (x 16 channels: 8 zmm accumulators).
TILE_X = 8


def supports(channels: int, out_channels: int, kh: int, kw: int) -> str:
    """Why the kernel cannot take a grouped convolution of this shape ('' when it can)."""
    if out_channels != channels:
        return f"depthwise channel multiplier {out_channels // max(channels, 1)} (only 1 is supported)"
    if channels % LANES:
        return f"depthwise convolution's {channels} channels are not a multiple of {LANES}"
    if kh * kw * 255 * 128 >= EXACT_LIMIT:
        return f"a {kh}x{kw} window's sums could exceed 2^24, where fp32 stops being exact"
    return ""


def pack_weight(w: np.ndarray) -> np.ndarray:
    """``[C, 1, KH, KW]`` int8 -> ``[KH, KW, C]`` fp32 (exact): one tap's channels are one vector of lanes."""
    return np.ascontiguousarray(w[:, 0].transpose(1, 2, 0).astype(np.float32))


def depthwise_u8s8(
    n: int,
    h: int,
    w: int,
    c: int,
    kh: int,
    kw: int,
    strides: tuple[int, int],
    out_hw: tuple[int, int],
    out_dtype: str = "int32",
) -> Any:
    """The scheduled PrimFunc ``(x u8[n,h,w,c] (padded), w f32[kh,kw,c], za u8[], colsum i32[c]) -> i32[n,oh,ow,c]``;
    with an 8-bit ``out_dtype``, a ``requantize`` table ``f32[4, c]`` follows ``colsum`` and the
    write-back requantizes (``kernels.requantize``)."""
    oh, ow = out_hw
    sh, sw = strides
    x = te.placeholder((n, h, w, c), "uint8", name="x")
    wp = te.placeholder((kh, kw, c), "float32", name="w_packed")
    za = te.placeholder((), "uint8", name="za")
    colsum = te.placeholder((c,), "int32", name="colsum")
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    acc = te.compute(
        (n, oh, ow, c),
        lambda b, y, xx, j: te.sum(x[b, y * sh + ry, xx * sw + rx, j].astype("float32") * wp[ry, rx, j], axis=[ry, rx]),
        name="acc",
    )
    table = requantize.placeholder(c)

    def corrected(b: Any, y: Any, xx: Any, j: Any) -> Any:
        value = acc[b, y, xx, j].astype("int32") - za[()].astype("int32") * colsum[j]
        return value if out_dtype == "int32" else requantize.apply(value, table, j, out_dtype)

    out = te.compute((n, oh, ow, c), corrected)
    params = [x, wp, za, colsum, *([] if out_dtype == "int32" else [table]), out]
    sch = s_tir.Schedule(te.create_prim_func(params))
    block = sch.get_sblock("acc")
    b, y, xx, j, ry_l, rx_l = sch.get_loops(block)
    jo, jl = sch.split(j, [None, LANES])
    xo, xi = sch.split(xx, [None, largest_divisor(ow, TILE_X)])
    sch.reorder(b, y, xo, jo, ry_l, rx_l, xi, jl)
    # global scope: a tile under 1 KiB is then a stack array, not a workspace call pair per tile
    tile = largest_divisor(ow, TILE_X) * LANES * 4
    writeback = sch.cache_write(block, 0, "global" if tile < STACK_BYTES else "local")
    sch.reverse_compute_inline(sch.get_sblock(out.op.name))
    outer = sch.fuse(b, y)
    if n * oh * ow * c * kh * kw >= PARALLEL_MIN_MACS:  # else on the calling thread (vnni_dense's reason)
        sch.parallel(outer)
    sch.reverse_compute_at(writeback, jo)
    sch.vectorize(jl)  # before the reduction is split: TVM vectorizes a complete reduction block only
    for loop in (ry_l, rx_l, xi):
        sch.unroll(loop)
    init = sch.decompose_reduction(block, ry_l)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.vectorize(sch.get_loops(writeback)[-1])
    # Opaque to FuseOps: as a plain reduction it would be fused with the elementwise ops after it
    # into a new, unscheduled PrimFunc (the VNNI kernels are opaque by their tensorized blocks).
    return sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("op_pattern", OPAQUE)
