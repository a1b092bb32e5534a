"""QDQ convolutions (static ``int8``) on the VNNI convolution kernel (tvm target).

The importer keeps ``conv2d(dequantize(q_u8, s, z), dequantize(w_s8, sw, 0))``: a float
convolution on values that are integers underneath. Here it is computed in integers, as ONNX
Runtime's QLinearConv does: the uint8 activation goes channels-last and padded with the zero
point ``z`` (which dequantizes to 0) in one pass that the quantize producing it fuses into,
``targets.tvm.kernels.vnni_conv`` convolves it with the constant weight, and the int32
result is scaled back to float by ``s * sw`` per output channel and returned to NCHW.
Channels are padded to a multiple of 4 with zero weights, so 3-channel stems qualify.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from aotforge.targets.tvm.kernels import vnni_conv, vnni_dense
from aotforge.targets.tvm.relax_util import constant_value, op_name, static_shape
from aotforge.targets.tvm.rewrites.rule import MatchResult, Rewriter, Rule


@dataclass(frozen=True)
class ConvShape:
    n: int
    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]

    @property
    def out_hw(self) -> tuple[int, int]:
        hp, wp = self.padded_hw
        return (hp - self.kh) // self.strides[0] + 1, (wp - self.kw) // self.strides[1] + 1

    @property
    def channels(self) -> int:
        """``C`` padded to the kernel's group of 4 (zero weights): a 3-channel stem reads 4."""
        return -(-self.c // vnni_dense.GROUP) * vnni_dense.GROUP

    @property
    def padded_hw(self) -> tuple[int, int]:
        top, left, bottom, right = self.padding
        return self.h + top + bottom, self.w + left + right


def conv_shape(call: Any, x_shape: list[int], w_shape: list[int]) -> ConvShape | str:
    """The shape of a plain NCHW/OIHW ``relax.nn.conv2d`` call, or why the kernel cannot take it."""
    attrs = call.attrs
    if str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW" or str(attrs.out_layout) != "NCHW":
        return "convolution is not NCHW/OIHW"
    if int(attrs.groups) != 1 or any(int(d) != 1 for d in attrs.dilation):
        return "grouped or dilated convolution"
    n, c, h, w = x_shape
    o, _, kh, kw = w_shape
    top, left, bottom, right = (int(p) for p in attrs.padding)
    strides = (int(attrs.strides[0]), int(attrs.strides[1]))
    shape = ConvShape(n, c, h, w, o, kh, kw, strides, (top, left, bottom, right))
    if o % vnni_dense.LANES:
        return f"{o} output channels are not a multiple of {vnni_dense.LANES}"
    return shape


def pad_channels_last(q: Any, zero_point: Any, shape: ConvShape) -> Any:
    """TE: uint8 ``[N, C, H, W]`` -> ``[N, H + pads, W + pads, C']``; the padding is the zero point."""
    from tvm import te, tirx

    top, left = shape.padding[:2]

    def value(n: Any, y: Any, x: Any, c: Any) -> Any:
        inside = tirx.all(c < shape.c, y >= top, y < top + shape.h, x >= left, x < left + shape.w)
        return tirx.if_then_else(inside, q[n, tirx.min(c, shape.c - 1), y - top, x - left], zero_point[()])

    return te.compute((shape.n, *shape.padded_hw, shape.channels), value, name="pad_channels_last")


@dataclass(frozen=True)
class ConvMatch:
    """The uint8 input ``q`` with its scalar ``scale`` / ``zero``, the int8 weight and its per-channel scale."""

    q: Any
    scale: np.ndarray
    zero: np.ndarray
    weight: np.ndarray
    weight_scale: np.ndarray
    shape: ConvShape


class QdqConvToVnni(Rule):
    name = "conv2d"

    def matches(self, call: Any, bound: Callable[[Any], Any]) -> bool:
        return op_name(call) == "relax.nn.conv2d" and all(
            op_name(bound(a)) == "relax.dequantize" for a in call.args[:2]
        )

    def check(self, call: Any, rw: Rewriter) -> MatchResult[Any]:
        x, w = rw.bound(call.args[0]), rw.bound(call.args[1])
        q, s, z = x.args
        weight, sw, zw = (constant_value(rw.bound(e)) for e in w.args)
        scale, zero = constant_value(s), constant_value(z)
        if str(q.ty.dtype) != "uint8" or scale is None or zero is None or scale.size != 1 or zero.size != 1:
            return MatchResult.fail("convolution input is not uint8 with one constant scale and zero point")
        if weight is None or sw is None or zw is None or weight.dtype != np.int8 or np.any(zw != 0):
            return MatchResult.fail("convolution weight is not a constant symmetric int8 tensor")
        x_shape, w_shape = static_shape(q), static_shape(w)
        if x_shape is None or w_shape is None:
            return MatchResult.fail("convolution shape is symbolic")
        shape = conv_shape(call, x_shape, w_shape)
        if isinstance(shape, str):
            return MatchResult.fail(shape)
        return MatchResult(ConvMatch(q, scale, zero, weight, sw, shape))

    def rewrite(self, call: Any, match: ConvMatch, rw: Rewriter) -> Any:
        """Pad channels-last, convolve in int32, scale per output channel to float, back to NCHW."""
        from tvm import relax

        shape = match.shape
        zero_point = relax.const(match.zero.reshape(()).astype(np.uint8))
        pad = functools.partial(pad_channels_last, shape=shape)
        padded = rw.builder_.emit(rw.builder_.call_te(pad, match.q, zero_point, primfunc_name_hint="pad_nhwc"))
        out = rw.builder_.emit(_conv_call(rw, shape, padded, zero_point, match.weight))
        per_channel = np.float32(match.scale.reshape(())) * np.broadcast_to(match.weight_scale, (shape.o,))
        scaled = relax.op.multiply(relax.op.astype(out, "float32"), relax.const(per_channel.astype(np.float32)))
        return relax.op.permute_dims(rw.builder_.emit(scaled), [0, 3, 1, 2])


def _conv_call(rw: Rewriter, shape: ConvShape, padded: Any, zero_point: Any, weight: np.ndarray) -> Any:
    """The ``call_tir`` of the VNNI convolution kernel for ``shape`` (added once per shape)."""
    from tvm import relax

    oh, ow = shape.out_hw
    key = (*shape.padded_hw, shape.channels, shape.o, shape.kh, shape.kw, *shape.strides, shape.n)
    kernel = rw.add_kernel(
        "vnni_conv2d_" + "x".join(str(v) for v in key),
        lambda: vnni_conv.conv2d_u8s8(
            shape.n, *shape.padded_hw, shape.channels, shape.o, shape.kh, shape.kw, shape.strides, (oh, ow)
        ),
    )
    colsum = weight.astype(np.int32).sum(axis=(1, 2, 3), dtype=np.int32)
    args = [padded, relax.const(vnni_conv.pack_weight(weight, shape.channels)), zero_point, relax.const(colsum)]
    return relax.call_tir(kernel, args, relax.TensorType([shape.n, oh, ow, shape.o], "int32"))
