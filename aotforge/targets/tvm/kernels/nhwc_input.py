"""Where a quantized CNN enters the integer kernels: NCHW (float or uint8) -> padded uint8 NHWC, in one pass.

The first integer convolution of a graph (the stem) reads the model's NCHW input, quantized.
Left to fusion, the quantize, the transpose to channels-last, the spatial padding with the zero
point and the channel padding to 4 became one injective loop that the default schedule
vectorized over 16 flattened output elements: 16 gathers with a division and a modulo each. Here the
same values come from a loop nest that keeps each output pixel's channels as one unrolled scalar run,
an order of magnitude faster.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import s_tir, te, tirx

VECTOR = 16
#: Below this many output bytes these copies run on the calling thread. They move a pixel's
#: channels as one vector in microseconds; split over 2 threads they took longer (the fork/join, and a
#: descheduled worker's time slice). The injective rule's element count (``PARALLEL_MIN``) is for
#: float kernels doing arithmetic, not byte copies.
PARALLEL_MIN_BYTES = 1 << 20


def _parallel(sch: s_tir.Schedule, loop: Any, out: Any) -> None:
    """Run ``loop`` in parallel when ``out`` is big enough to pay for a fork/join."""
    elements = 1
    for d in out.shape:
        elements *= int(d)
    if elements * tvm.DataType(out.dtype).bits // 8 >= PARALLEL_MIN_BYTES:
        sch.parallel(loop)


#: ``OpPatternKind::kOpaque``: fusion would rebuild it unscheduled.
OPAQUE = 8


def to_nhwc_padded(
    shape: tuple[int, int, int, int], padding: tuple[int, int, int, int], channels: int, *, quantize: bool
) -> Any:
    """The scheduled PrimFunc ``(x [n,c,h,w], scale f32[] (if quantize), zero u8[]) -> u8[n, h', w', channels]``.

    ``x`` is float32 quantized on the way (``clip(round(x * (1 / scale)) + zero, 0, 255)``) when
    ``quantize``, else uint8; the padding (spatial ``padding`` as top, left,
    bottom, right, and channels up to ``channels``) is the zero point.
    """
    n, c, h, w = shape
    top, left, bottom, right = padding
    x = te.placeholder(shape, "float32" if quantize else "uint8", name="x")
    scale = te.placeholder((), "float32", name="scale")
    zero = te.placeholder((), "uint8", name="zero")

    def value(b: Any, y: Any, xx: Any, ch: Any) -> Any:
        inside = tirx.all(ch < c, y >= top, y < top + h, xx >= left, xx < left + w)
        v = x[b, tirx.min(ch, c - 1), y - top, xx - left]
        if quantize:
            # times the reciprocal, as the requantizing epilogues (``rewrites.channels_last``)
            v = tirx.max(tirx.min(tirx.round(v * (1.0 / scale[()])) + zero[()].astype("float32"), 255.0), 0.0)
        return tirx.if_then_else(inside, v.astype("uint8"), zero[()])

    out = te.compute((n, h + top + bottom, w + left + right, channels), value, name="nhwc_padded")
    sch = s_tir.Schedule(te.create_prim_func([x, *([scale] if quantize else []), zero, out]))
    b, y, _, ch = sch.get_loops(sch.get_sblock("nhwc_padded"))
    _parallel(sch, sch.fuse(b, y), out)
    sch.unroll(ch)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("op_pattern", OPAQUE)


def pad_nhwc(shape: tuple[int, int, int, int], padding: tuple[int, int, int, int], channels: int) -> Any:
    """The scheduled PrimFunc ``(x u8[n,h,w,c], zero u8[]) -> u8[n, h', w', channels]``: zero-point padding.

    Fused into the requantizing epilogue before it, the padding's bounds test ran per element of a
    loop flattened over pixels and channels (as long as the epilogue's own work); here it is one test per pixel,
    with the channels a vector.
    """
    n, h, w, c = shape
    top, left, bottom, right = padding
    x = te.placeholder(shape, "uint8", name="x")
    zero = te.placeholder((), "uint8", name="zero")

    def value(b: Any, y: Any, xx: Any, ch: Any) -> Any:
        inside = tirx.all(ch < c, y >= top, y < top + h, xx >= left, xx < left + w)
        return tirx.if_then_else(inside, x[b, y - top, xx - left, tirx.min(ch, c - 1)], zero[()])

    out = te.compute((n, h + top + bottom, w + left + right, channels), value, name="nhwc_padded")
    sch = s_tir.Schedule(te.create_prim_func([x, zero, out]))
    b, y, _, ch = sch.get_loops(sch.get_sblock("nhwc_padded"))
    _parallel(sch, sch.fuse(b, y), out)
    if channels == c and c % VECTOR == 0:
        sch.vectorize(sch.split(ch, [None, VECTOR])[1])
    return sch.mod["main"].with_attr("tirx.is_scheduled", True).with_attr("op_pattern", OPAQUE)
