# mypy: disable-error-code="valid-type"
# (TVMScript buffer annotations are calls, which mypy cannot read as types.)
"""A CNN's NCHW input (3 channels, float or uint8) -> padded 4-channel NHWC uint8, 16 pixels at a time.

``nhwc_input.to_nhwc_padded`` writes one output pixel per step, its channels an unrolled scalar run:
a 96 x 96 image is ~9,600 steps of 4 scalar quantizes and 4 byte stores, a visible share of a
MobileNet-style int8 call. With 4 channels a run of 16 pixels is 64 output bytes: each channel's 16 pixels are one
contiguous NCHW load and one vector quantize, and the 4 results interleave into the 64 bytes
(``byte_lanes``, byte ``4i + k`` = channel ``k`` of pixel ``i``), so a run is ~20 vector instructions.
The padding (the zero point) is written around the runs, never under them.
"""

from __future__ import annotations

from typing import Any

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from aotforge.targets.tvm.kernels.byte_lanes import interleave_bytes
from aotforge.targets.tvm.kernels.nhwc_input import OPAQUE, PARALLEL_MIN_BYTES

#: output channels (the VNNI convolution's group of 4 input bytes) and pixels per run
CHANNELS = 4
RUN = 16


def supports(shape: tuple[int, int, int, int], channels: int) -> bool:
    """Whether this kernel takes an NCHW ``shape`` padded to ``channels`` (else ``to_nhwc_padded``)."""
    return channels == CHANNELS and shape[1] <= CHANNELS and shape[3] >= RUN


def _quantized(v: Any, inverse: Any, zero: Any) -> Any:
    """``to_nhwc_padded``'s quantize on 16 lanes (the same operations, so the same bytes), as int32."""
    rounded = tirx.round(v * T.broadcast(inverse, RUN)) + T.broadcast(tirx.Cast("float32", zero), RUN)
    clamped = tirx.max(tirx.min(rounded, T.broadcast(tirx.FloatImm("float32", 255.0), RUN)), T.broadcast(0.0, RUN))
    return tirx.Cast(f"int32x{RUN}", clamped)


def to_nhwc4(shape: tuple[int, int, int, int], padding: tuple[int, int, int, int], *, quantize: bool) -> Any:
    """``to_nhwc_padded(shape, padding, 4, quantize=quantize)``, the same PrimFunc signature and bytes."""
    n, c, h, w = shape
    top, left, bottom, right = padding
    hp, wp = h + top + bottom, w + left + right
    interior = T.parallel if n * hp * wp * CHANNELS >= PARALLEL_MIN_BYTES else T.serial
    with IRBuilder() as ib, T.prim_func():
        T.func_name("main")
        x = T.arg("x", T.buffer(shape, "float32" if quantize else "uint8"))
        scale = T.arg("scale", T.buffer((), "float32")) if quantize else None
        zero = T.arg("zero", T.buffer((), "uint8"))
        out = T.arg("nhwc_padded", T.buffer((n, hp, wp, CHANNELS), "uint8"))
        T.func_attr({"tirx.noalias": True})
        xf = T.decl_buffer((n * c * h * w,), x.dtype, data=x.data)
        of = T.decl_buffer((n * hp * wp * CHANNELS,), "uint8", data=out.data)
        pixel = T.broadcast(zero[()], CHANNELS)

        def pad(first_pixel: Any, count: Any) -> None:
            with T.serial(0, count) as p:
                T.buffer_store(of, pixel, [T.ramp((first_pixel + p) * CHANNELS, 1, CHANNELS)])

        with T.serial(0, n) as b:
            pad(b * hp * wp, top * wp)
            pad((b * hp + top + h) * wp, bottom * wp)
            with interior(0, h) as y:
                row = (b * hp + top + y) * wp
                pad(row, left)
                pad(row + left + w, right)
                source = [((b * c + ch) * h + y) * w for ch in range(c)]
                inverse = 1.0 / scale[()] if scale is not None else None
                with T.serial(0, w // RUN) as run:
                    loads = [xf[T.ramp(s + run * RUN, 1, RUN)] for s in source]
                    values = [
                        _quantized(v, inverse, zero[()]) if quantize else tirx.Cast(f"int32x{RUN}", v) for v in loads
                    ]
                    values += [T.broadcast(tirx.Cast("int32", zero[()]), RUN)] * (CHANNELS - c)
                    start = (row + left + run * RUN) * CHANNELS
                    T.buffer_store(of, interleave_bytes(values, "uint8"), [T.ramp(start, 1, RUN * CHANNELS)])
                with T.serial(w // RUN * RUN, w) as xx:  # the last pixels of a row that is no whole number of runs
                    for ch in range(CHANNELS):
                        if ch < c:
                            v = xf[source[ch] + xx]
                            byte = _scalar(v, inverse, zero[()]) if quantize else v
                        else:
                            byte = zero[()]
                        T.buffer_store(of, byte, [(row + left + xx) * CHANNELS + ch])
    return ib.get().with_attr("tirx.is_scheduled", True).with_attr("op_pattern", OPAQUE)


def _scalar(v: Any, inverse: Any, zero: Any) -> Any:
    """``_quantized`` on one value, as uint8."""
    value = tirx.max(tirx.min(tirx.round(v * inverse) + tirx.Cast("float32", zero), 255.0), 0.0)
    return tirx.Cast("uint8", value)
