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

from dataclasses import dataclass
from typing import Any

from aotforge.targets.tvm.kernels import vnni_dense


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
