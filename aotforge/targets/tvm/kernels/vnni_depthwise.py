# mypy: disable-error-code="valid-type"
# (TVMScript buffer annotations are calls, which mypy cannot read as types.)
"""A u8 x s8 NHWC depthwise convolution on AVX-512 VNNI, reading the padded input in place.

``vpdpbusd`` sums 4 neighbouring byte products into each int32 lane. A depthwise convolution has
no products to share between channels, and putting 4 taps of one channel side by side would mean
a byte transpose of the input. Instead each instruction here takes 64 contiguous input bytes as
they lie (channels last) and a weight vector that is zero in 3 of each 4 bytes: with the weight's
nonzero byte at position ``k`` of each group, lane ``i`` gets only byte ``4i + k``'s product. Four
such instructions per tap (``k`` = 0..3) give 4 accumulators that hold the 64 positions
de-interleaved (``acc_k[i]`` is position ``4i + k``). That is one multiply per output and tap, as
the fp32 kernel (``int8_depthwise``) does, but with no widening or u8 -> f32 conversion of the
input (fp32: ~4 conversions per 16 outputs beside the 9 FMAs).

The write-back puts the positions back in order: requantized (``kernels.requantize``, with its
table in the same de-interleaved lane order), the 4 accumulators are one int32 vector of bytes,
``a0 | a1 << 8 | a2 << 16 | a3 << 24``; an int32 output is a shuffle of the 4.

A run of 64 output bytes along a row reads 64 contiguous input bytes per tap when the stride
is 1 (any channel count dividing into 16-byte groups; a run may cover several pixels) or when the
channels are a multiple of 64 (a run is one pixel's block of channels). Which channel each
position holds repeats every ``lcm(64, C)`` bytes, so the weights and the per-channel constants
are laid out per phase of that period (``lane_channels``; a period of one run is taken as two, see
``_accumulate``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from aotforge.targets.tvm.kernels import requantize
from aotforge.targets.tvm.kernels.byte_lanes import interleave_bytes
from aotforge.targets.tvm.kernels.nhwc_input import OPAQUE
from aotforge.targets.tvm.kernels.vnni_dense import largest_divisor
from aotforge.targets.tvm.schedules.matmul import PARALLEL_MIN_MACS

#: bytes one ``vpdpbusd`` reads: a run of outputs along a row
RUN = 64
#: runs along a row per register tile (x 4 accumulators: 16 of the 32 zmm registers)
TILE_RUNS = 4


def supports(channels: int, stride_w: int, out_w: int) -> str:
    """Why this kernel cannot take a depthwise convolution of this shape ('' when it can)."""
    if channels % 16:
        return f"{channels} channels are not a multiple of 16"
    if stride_w != 1 and channels % RUN:
        return f"stride {stride_w} with {channels} channels (a multiple of {RUN} is needed)"
    if (out_w * channels) % (_repeat(channels) * RUN):
        return f"an output row of {out_w} x {channels} bytes is not a whole number of channel periods"
    return ""


def _repeat(channels: int) -> int:
    """Runs of 64 bytes after which the channel at each position repeats."""
    return math.lcm(RUN, channels) // RUN


def period(channels: int, out_w: int) -> int:
    """The phases the kernel loops over: the runs after which the channels repeat, or 2 where that is
    1 and an output row is a whole number of pairs of runs (``_accumulate`` says why)."""
    repeat = _repeat(channels)
    return 2 if repeat == 1 and (out_w * channels) % (2 * RUN) == 0 else repeat


def lane_channels(channels: int, out_w: int) -> np.ndarray:
    """The channel of each accumulator lane, ordered ``(phase, k, i)``: ``[period * 64]``; index a
    per-channel constant (``colsum``, the requantize table) with it."""
    phase, k, i = np.meshgrid(np.arange(period(channels, out_w)), np.arange(4), np.arange(16), indexing="ij")
    return ((phase * RUN + 4 * i + k) % channels).reshape(-1)


def pack_weight(w: np.ndarray, out_w: int) -> np.ndarray:
    """``[C, 1, KH, KW]`` int8 -> ``[KH, KW, period, 4, 64]``: per tap, phase and ``k``, the 64 weight
    bytes with the channel of each position at bytes ``4i + k`` and zero elsewhere."""
    c, _, kh, kw = w.shape
    position = np.arange(RUN)
    phases = period(c, out_w)
    packed = np.zeros((kh, kw, phases, 4, RUN), np.int8)
    for phase in range(phases):
        channel = (phase * RUN + position) % c
        for k in range(4):
            keep = position % 4 == k
            packed[:, :, phase, k, keep] = w[channel[keep], 0].transpose(1, 2, 0)
    return packed


def _dot(acc: Any, a: Any, w: Any) -> Any:
    """``acc + `` the 4-byte dot of each lane of ``a`` (u8) and ``w`` (s8): one ``vpdpbusd``."""
    intrinsic = T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512")
    return T.call_llvm_pure_intrin("int32x16", intrinsic, acc, a, w)


def _requantize(acc: Any, table: Any, at: Any) -> Any:
    """``kernels.requantize.apply`` on 16 lanes, to int32: clamped first, then rounded by the
    conversion (``vcvtps2dq``, to nearest even as ``round``; the same since the bounds are integers)."""
    value = tirx.Cast("float32x16", acc) * table[0, at] + table[1, at]
    clamped = tirx.min(tirx.max(value, table[2, at]), table[3, at])
    intrinsic = T.llvm_lookup_intrinsic_id("llvm.x86.avx512.mask.cvtps2dq.512")
    all_lanes, current_rounding = tirx.IntImm("int16", -1), tirx.IntImm("int32", 4)
    return T.call_llvm_pure_intrin("int32x16", intrinsic, clamped, T.broadcast(0, 16), all_lanes, current_rounding)


def _in_order(accs: list[Any]) -> list[Any]:
    """The 4 de-interleaved accumulators as 4 vectors of positions 0-15, 16-31, ... (a shuffle each)."""
    orders = [[(m % 4) * 16 + 4 * j + m // 4 for m in range(16)] for j in range(4)]
    return [tirx.Shuffle(accs, [tirx.IntImm("int32", i) for i in order]) for order in orders]


@dataclass(frozen=True)
class _Rows:
    """Where a tile's runs lie: ``start(row, phase, run)`` is the first byte (element) of output run
    ``run`` of ``phase`` in output row ``row``; ``source(row, phase, run, ry, rx)`` the input byte
    that tap ``(ry, rx)`` reads for its first position."""

    h: int
    w: int
    c: int
    oh: int
    ow: int
    strides: tuple[int, int]

    @property
    def span(self) -> int:
        """Output bytes of one pass over the phases."""
        return period(self.c, self.ow) * RUN

    def start(self, row: Any, phase: Any, run: Any) -> Any:
        return row * self.ow * self.c + run * self.span + phase * RUN

    def source(self, row: Any, phase: Any, run: Any, ry: Any, rx: int) -> Any:
        """With a stride, a whole repeat of the channels (one pixel's when it is a multiple of 64)
        steps ``stride`` pixels in the input, and a phase within it does not."""
        sh, sw = self.strides
        y = row // self.oh * self.h + row % self.oh * sh + ry
        repeat = _repeat(self.c)
        within = phase // repeat * repeat * RUN * sw + phase % repeat * RUN
        return y * self.w * self.c + run * self.span * sw + within + rx * self.c


def _accumulate(
    rows: _Rows, xf: Any, wf: Any, init: list[Any], where: tuple[Any, Any, list[Any]], k_size: tuple[int, int]
) -> list[list[Any]]:
    """The tile's accumulators: for each tap, each run's 64 input bytes (one load) times the tap's 4
    masked weight vectors of the phase. The weights must change from one iteration of the innermost
    loop to the next: where they are invariant in the tile loop (the window unrolled, or one phase),
    LLVM hoists all 36 of a 3x3 window out of it into the registers the 16 accumulators need
    (spilled, slower than the fp32 kernel). So the phases are the innermost loop, at least 2 of
    them (``period``: a copy of the weights per phase), and the window's rows a loop.

    The kernel must keep ``tirx.noalias`` all the same: one PrimFunc without it and TVM's LLVM codegen
    drops the noalias compute functions of every kernel in the module (the MobileNet-style CNN's
    1x1 VNNI convolutions then ran much slower)."""
    row, phase, runs = where
    kh, kw = k_size
    accs = [T.alloc_buffer((len(runs) * 16,), "int32") for _ in range(4)]  # registers, after LLVM's SROA
    for t in range(len(runs)):
        for k, value in enumerate(init):
            T.buffer_store(accs[k], value, [T.ramp(t * 16, 1, 16)])
    with T.serial(0, kh) as ry:
        for rx in range(kw):
            weights = ((ry * kw + rx) * period(rows.c, rows.ow) + phase) * 4 * RUN
            for t, run in enumerate(runs):
                a = T.bind(xf[T.ramp(rows.source(row, phase, run, ry, rx), 1, RUN)])
                for k in range(4):
                    at = [T.ramp(t * 16, 1, 16)]
                    T.buffer_store(accs[k], _dot(accs[k][at[0]], a, wf[T.ramp(weights + k * RUN, 1, RUN)]), at)
    return [[accs[k][T.ramp(t * 16, 1, 16)] for k in range(4)] for t in range(len(runs))]


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
    """``(x u8[n,h,w,c] (padded), w_packed s8 (pack_weight), za u8[], colsum i32[L]) -> out[n,oh,ow,c]``
    with ``L = period * 64`` and ``colsum`` in ``lane_channels`` order; with an 8-bit ``out_dtype`` a
    ``requantize`` table ``f32[4, L]`` in the same order follows ``colsum``."""
    oh, ow = out_hw
    rows = _Rows(h, w, c, oh, ow, strides)
    phases, lanes = period(c, ow), rows.span
    runs = ow * c // rows.span  # runs of each phase along an output row
    tile = largest_divisor(runs, TILE_RUNS)
    parallel = n * oh * ow * c * kh * kw >= PARALLEL_MIN_MACS  # else on the calling thread (vnni_dense's reason)
    with IRBuilder() as ib, T.prim_func():
        T.func_name("main")
        x = T.arg("x", T.buffer((n, h, w, c), "uint8"))
        wp = T.arg("w_packed", T.buffer((kh, kw, phases, 4, RUN), "int8"))
        za = T.arg("za", T.buffer((), "uint8"))
        colsum = T.arg("colsum", T.buffer((lanes,), "int32"))
        table = None if out_dtype == "int32" else T.arg("requantize", T.buffer((requantize.ROWS, lanes), "float32"))
        out = T.arg("out", T.buffer((n, oh, ow, c), out_dtype))
        T.func_attr({"tirx.noalias": True})
        xf = T.decl_buffer((n * h * w * c,), "uint8", data=x.data)
        wf = T.decl_buffer((kh * kw * phases * 4 * RUN,), "int8", data=wp.data)
        of = T.decl_buffer((n * oh * ow * c,), out_dtype, data=out.data)
        with (T.parallel if parallel else T.serial)(0, n * oh) as row, T.serial(0, runs // tile) as xt:
            with T.serial(0, phases) as phase:
                lane = [T.ramp(phase * RUN + k * 16, 1, 16) for k in range(4)]
                zero_point = T.broadcast(0 - tirx.Cast("int32", za[()]), 16)
                tile_runs = [xt * tile + t for t in range(tile)]
                init = [zero_point * colsum[at] for at in lane]  # the zero point's share, as vnni_conv
                accs = _accumulate(rows, xf, wf, init, (row, phase, tile_runs), (kh, kw))
                for run, acc in zip(tile_runs, accs, strict=True):
                    base = rows.start(row, phase, run)
                    if table is None:
                        for j, vector in enumerate(_in_order(acc)):
                            T.buffer_store(of, vector, [T.ramp(base + j * 16, 1, 16)])
                    else:
                        values = [_requantize(a, table, at) for a, at in zip(acc, lane, strict=True)]
                        T.buffer_store(of, interleave_bytes(values, out_dtype), [T.ramp(base, 1, RUN)])
    # Opaque to FuseOps: fused with the elementwise ops after it, it would be rebuilt unscheduled.
    return ib.get().with_attr("tirx.is_scheduled", True).with_attr("op_pattern", OPAQUE)
